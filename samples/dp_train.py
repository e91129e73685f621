"""A small torch.nn.DataParallel training run: every visible GPU with DataParallel; on a machine without GPUs
the same script runs unchanged (DataParallel then just calls the model).

    python samples/dp_train.py                      # bare
    ddpdoctor trace samples/dp_train.py             # traced
    CUDA_VISIBLE_DEVICES=0,1 python samples/dp_train.py --batch-size 512

Each parameter stays well under 32 MiB (glibc would mmap/unmap bigger tensors every step on CPU, making step
times jumpy). The data is synthetic and stays in host memory, as a DataLoader's batches would.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


def build_model(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=256, help="whole batch, split across the GPUs")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    # DataParallel wants the module on device_ids[0]; the outputs come back there too.
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    model = nn.DataParallel(build_model(args.width, args.depth).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    # A few batches, reused: host memory stays small whatever --steps is.
    batches = min(args.steps, 8)
    inputs = torch.randn(batches, args.batch_size, args.width)
    targets = torch.randint(0, 10, (batches, args.batch_size))
    loss = torch.zeros(())
    for step in range(args.steps):
        # Inputs stay on the host: DataParallel scatters them to the GPUs itself.
        output = model(inputs[step % batches])
        loss = loss_fn(output, targets[step % batches].to(output.device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"{args.steps} steps on {len(model.device_ids) or 'no'} GPU(s), final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
