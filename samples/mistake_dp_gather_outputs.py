"""Mistake: nn.DataParallel returns a language model's full logits, gathered onto GPU 0 every step.

The model returns `[batch, seq, vocab]` logits; DataParallel gathers every replica's share onto the output
device (GPU 0), where the loss and the start of backward then run alone. With a large vocabulary that is
hundreds of MB per step, and GPU 0 runs out of memory first. ddpdoctor reports `dp-gathers-large-outputs` with
the bytes per step.

    ddpdoctor trace samples/mistake_dp_gather_outputs.py          # on a machine with 2+ GPUs

The fix: compute the loss inside the module, so each replica returns one number (`--loss-inside` here), or
better, move to DistributedDataParallel.

Without GPUs DataParallel just calls the module (nothing is gathered); the tests run this model through
DataParallel's real multi-device code on CPU (tests/dp_harness.py).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn


class TinyLM(nn.Module):
    """Embedding -> MLP -> vocabulary logits; with `targets`, returns the loss instead of the logits."""

    def __init__(self, vocab: int, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.mlp = nn.Sequential(nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.mlp(self.embed(tokens)))
        if targets is None:
            return logits  # the mistake: [batch, seq, vocab] floats gathered onto GPU 0
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return loss.unsqueeze(0)  # one number per replica


def train(
    model: nn.Module, *, steps: int, batch: int, seq: int, vocab: int, loss_inside: bool, device: torch.device
) -> float:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.zeros(())
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (batch, seq), device=device)
        targets = torch.randint(0, vocab, (batch, seq), device=device)
        if loss_inside:
            loss = model(tokens, targets).mean()
        else:
            logits = model(tokens)
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="whole batch, split across the GPUs")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--loss-inside", action="store_true", help="the fix: each replica returns its loss")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    model = nn.DataParallel(TinyLM(args.vocab, args.width).to(device))
    loss = train(
        model,
        steps=args.steps,
        batch=args.batch_size,
        seq=args.seq,
        vocab=args.vocab,
        loss_inside=args.loss_inside,
        device=device,
    )
    print(f"done: {args.steps} steps, last loss {loss:.4f}")


if __name__ == "__main__":
    main()
