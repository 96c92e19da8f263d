"""The table printed at the end of a run and the JSON written next to it."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import platform
import subprocess
from pathlib import Path

import torch

from benchmarks import _cli
from benchmarks.runner import Row


def environment(device: torch.device, command: str, settings: dict) -> dict:
    """The run's provenance: `command` as typed (`python -m benchmarks ...`), versions, device, commit."""
    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": version("triton"),
        "tensordict": version("tensordict"),
        "torchrl": version("torchrl"),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "cpu_threads": torch.get_num_threads(),
        "git_commit": _git_commit(),
        **settings,
    }
    return meta


def _git_commit() -> str | None:
    """HEAD's short hash, with "+dirty" when tracked files differ from it (numbers from edited code)."""
    def git(*args) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        return (head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")) or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_json(path: str | Path, meta: dict, rows: list[Row]) -> None:
    _cli.write_json(path, {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows]})


def _fmt(value: float | None, spec: str, empty: str = "-") -> str:
    return empty if value is None else format(value, spec)


def table(rows: list[Row], markdown: bool = False) -> str:
    """One table, rows grouped by (suite, shape, mode) in run order."""
    header = ["shape", "mode", "impl", "median ms", "min-max ms", "peak MiB", "/ ours best", "parity (max rel err)",
              "notes"]
    lines: list[list[str]] = []
    previous = None
    for r in rows:
        key = (r.suite, r.shape, r.mode)
        shape, mode = (r.shape, r.mode) if key != previous else ("", "")
        previous = key
        if r.status == "ok":
            timing = [_fmt(r.median_ms, ".3f"), f"{r.min_ms:.3f}-{r.max_ms:.3f}", _fmt(r.peak_mem_mib, ".0f"),
                      _fmt(r.ratio_to_ours_best, ".2f") + "x"]
            parity = r.parity + ("" if r.parity_error is None or r.parity == "is the reference"
                                 else f" ({r.parity_error:.1e})")
            notes = ", ".join([r.settings] + [f"{v:,.0f} {k}/s" for k, v in r.per_second.items()])
        else:
            timing, parity, notes = ["-", "-", "-", "-"], r.status.upper(), r.reason
        lines.append([shape, mode, r.impl, *timing, parity, notes.strip(", ")])
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(cell.replace("|", "/") for cell in line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    widths[-1] = len(header[-1])  # notes run free at the end of the line
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *(fmt(line) for line in lines)])


DOCS_BEGIN, DOCS_END = "<!-- bench:begin -->", "<!-- bench:end -->"


def read_json(path: str | Path) -> tuple[dict, list[Row]]:
    payload = json.loads(Path(path).read_text())
    return payload["meta"], [Row(**row) for row in payload["rows"]]


def docs_section(runs: list[tuple[dict, list[Row]]]) -> str:
    """The markdown docs/benchmarks.md carries between its bench markers: for each run (one JSON),
    its provenance, then its table. Runs stay separate tables: a table never mixes processes."""
    return "\n".join([DOCS_BEGIN, *("\n".join([_provenance(meta), "", table(rows, markdown=True), ""])
                                     for meta, rows in runs), DOCS_END])


def _provenance(meta: dict) -> str:
    return "\n".join([
        f"- command: `{_command(meta['command'])}`",
        f"- date: {meta['date']}, commit {meta.get('git_commit') or 'unknown'}",
        f"- device: {meta['device_name']} ({meta['device']}), CUDA {meta.get('cuda')}, cuDNN {meta.get('cudnn')}",
        f"- torch {meta['torch']}, triton {meta['triton']}, tensordict {meta.get('tensordict')}, "
        f"torchrl {meta.get('torchrl')}, python {meta['python']}",
        f"- fp32 matmul precision: {meta['precision']}; parity tolerance {meta['rtol']}; "
        f"torchrl compiled variants: {'on' if meta['peer_compile'] else 'off'}",
        *([f"- note: {meta['note']}"] if meta.get("note") else []),
    ])


def _command(command: str) -> str:
    # results written before the move to `python -m benchmarks` recorded the script path and its
    # arguments only ("scripts/bench.py --device cuda ...")
    return command if command.startswith("python") else f"python {command}"


def update_docs(path: str | Path, section: str) -> None:
    """Replace the text between the bench markers of `path` with `section`."""
    text = Path(path).read_text()
    begin, end = text.find(DOCS_BEGIN), text.find(DOCS_END)
    if begin < 0 or end < begin:
        raise SystemExit(f"{path} has no '{DOCS_BEGIN}' ... '{DOCS_END}' section to replace")
    Path(path).write_text(text[:begin] + section + text[end + len(DOCS_END):])
