"""Under `ddpdoctor trace`, torch's warnings and the script's traceback read exactly as in a bare run: they point at
the user's (or torch's) lines, never at ddpdoctor's wrappers (issue 19, point 3)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SCRIPT = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Items(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            if i == 40:
                raise ValueError(f"bad sample {i}")
            return torch.randn(4), torch.tensor(i % 2)


    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(Items(), batch_size=4, pin_memory=True):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    """
)


def _script_lines(stderr: str) -> list[str]:
    """The script's own stderr: everything but ddpdoctor's progress lines."""
    return [line for line in stderr.splitlines() if not line.startswith("ddpdoctor:")]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the pin_memory warning is given only without an accelerator")
def test_warning_and_traceback_are_those_of_a_bare_run(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    bare = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    traced = run_cli(
        "trace",
        "--out",
        str(tmp_path / "run"),
        "--wait",
        "1",
        "--warmup",
        "1",
        "--active",
        "2",
        str(script),
        cwd=tmp_path,
    )
    assert bare.returncode == traced.returncode == 1
    expected = _script_lines(bare.stderr)
    assert any("UserWarning: 'pin_memory'" in line for line in expected), bare.stderr
    assert "ValueError: bad sample 40" in expected[-1]
    assert _script_lines(traced.stderr) == expected, traced.stderr
    assert "ddpdoctor/capture" not in traced.stderr
