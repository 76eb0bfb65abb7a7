"""The stream processor's cost in CPU instructions, against another revision, exactly.

On a shared machine the CPU time of one version moves by up to 25 % between runs
(docs/detection.md), so ``bench_stream.py`` cannot show a 5 % change. Counting the
instructions the processor executes can: Valgrind's callgrind counts them, the same
count on every run to within ~0.1 %. Instructions are not time (cache misses and
NumPy's vector loops weigh differently), but a change in the Python code shows
directly.

``python bench/bench_instr.py --against REV`` (``--size JOBS,NODES,STEPS``, default
8,8,300: the jobs ``bench_stream.py`` runs by default, so the ratio is that
benchmark's processor-only path counted exactly; about six minutes on two cores.
A smaller size runs faster, but warm-up weighs more in it):

1. generates the benchmark's messages once (``bench_stream.build``: simulated jobs of
   8 GPUs and 8 NICs a node) with this tree's code and writes their wire records to a
   temporary file, so that both versions read the same bytes;
2. checks REV out into a temporary git worktree;
3. for each tree, runs the processor-only path of ``bench_stream.py``
   (``StreamProcessor.process_batch``: decode, admission, duplicates, the detection
   core, metrics; no Kafka) on those records under callgrind, and once more reading
   them without processing them; the difference is the processing's instructions. A
   batch's clock is its newest record's time plus 0.5 s (as a worker reading live
   data sees it), so the runs do not depend on how slowly callgrind makes them go;
4. prints instructions per event for both and the ratio (this tree / REV). Figures
   only: no pass/fail.

Needs ``valgrind`` (``apt-get install valgrind``). A benchmark aid only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BATCH = 2000


def make_workload(path: Path, jobs: int, nodes: int, steps: int) -> int:
    """Write the wire records of the benchmark's messages to ``path``; their events."""
    import msgspec
    from bench_stream import build, records_in  # bench/, this script's folder

    from stepwatch.contract import KIND_OF, Topics, encode, message_key
    from stepwatch.settings import Settings

    topics = Topics(Settings().topic_prefix)
    messages = build(jobs, nodes, steps)
    wire = [(topics.for_kind(KIND_OF[type(m)]), message_key(m), encode(m), m.ts) for m in messages]
    path.write_bytes(msgspec.msgpack.encode(wire))
    return sum(records_in(m) for m in messages)


def use_tree(tree: Path) -> None:
    """Import ``stepwatch`` from ``tree``'s sources, not from the installed copy: the
    package is made from the tree's ``stepwatch/__init__.py`` with the tree's portions
    as its search path, before anything imports it (``sys.path`` is left alone; the
    rest of the process imports the installed dependencies as usual)."""
    # the tree's own portions: stepwatch/ and each service's src/stepwatch/ (older
    # revisions have none of those: their services are linked from stepwatch/)
    portions = [str(tree / "stepwatch"), *map(str, sorted(tree.glob("*/src/stepwatch")))]
    spec = importlib.util.spec_from_file_location(
        "stepwatch", tree / "stepwatch" / "__init__.py", submodule_search_locations=portions
    )
    if spec is None or spec.loader is None:
        raise SystemExit(f"bench_instr: no stepwatch package in {tree}")
    # an editable install's finder maps stepwatch's portions to the checkout it was made
    # from: without it, a module the tree lacks fails to import instead of coming from there
    sys.meta_path[:] = [f for f in sys.meta_path if not _editable_stepwatch(f)]
    module = importlib.util.module_from_spec(spec)
    sys.modules["stepwatch"] = module
    spec.loader.exec_module(module)


def _editable_stepwatch(finder: object) -> bool:
    name = getattr(finder, "__module__", "") or ""
    return name.startswith("__editable__") and "stepwatch" in name


@contextlib.contextmanager
def checkout(rev: str, where: Path) -> Iterator[Path]:
    """``rev`` of this repository checked out at ``where`` (a detached git worktree),
    removed afterwards."""
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", "-q", str(where), rev], check=True)
    try:
        yield where
    finally:
        subprocess.run([*git, "remove", "--force", str(where)], check=False)


def workload(tree: Path, path: Path, process: bool) -> None:
    """Run the processor-only path of ``tree`` on the records in ``path``."""
    use_tree(tree)
    import msgspec

    import stepwatch.streams.worker.processor as module
    from stepwatch.contract import Topics
    from stepwatch.settings import Settings
    from stepwatch.streams.worker.app import default_engine_factory, tune_gc
    from stepwatch.streams.worker.processor import Record, StreamProcessor

    assert Path(module.__file__).is_relative_to(tree), module.__file__
    wire = msgspec.msgpack.decode(path.read_bytes())
    settings = Settings()
    clock = [0.0]
    proc = StreamProcessor(
        Topics(settings.topic_prefix), default_engine_factory(settings), clock=lambda: clock[0]
    )
    recs = [Record(t, zlib.crc32(k) % 8, i, k, v) for i, (t, k, v, _) in enumerate(wire)]
    tune_gc()
    topics: dict[str, int] = {}
    for i in range(0, len(recs) if process else 0, BATCH):
        clock[0] = max(ts for *_, ts in wire[i : i + BATCH]) + 0.5
        for out in (*proc.process_batch(recs[i : i + BATCH]), *proc.tick(clock[0])):
            topics[out.topic] = topics.get(out.topic, 0) + 1
    print(json.dumps({"records": len(recs), "outputs": topics}))  # what the run did


def count(tree: Path, path: Path, process: bool) -> int:
    """Instructions of one workload run under callgrind."""
    cmd = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, __file__, "--run", str(tree), str(path),
    ]  # fmt: skip
    if not process:
        cmd.append("--setup-only")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind run failed ({tree}):\n{done.stderr[-3000:]}")
    return int(found.group(1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", help="a git revision to compare this tree with")
    p.add_argument("--size", default="8,8,300", help="JOBS,NODES,STEPS (default 8,8,300)")
    p.add_argument("--run", nargs=2, metavar=("TREE", "FILE"), help=argparse.SUPPRESS)
    p.add_argument("--setup-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run:
        workload(Path(args.run[0]), Path(args.run[1]), not args.setup_only)
        return 0
    if args.against is None:
        p.error("--against REV is required")
    if shutil.which("valgrind") is None:
        print("bench_instr: needs valgrind (apt-get install valgrind)", file=sys.stderr)
        return 2
    jobs, nodes, steps = (int(x) for x in args.size.split(","))
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        data = Path(tmp) / "records.msgpack"
        events = make_workload(data, jobs, nodes, steps)
        with checkout(args.against, Path(tmp) / "tree") as other:
            runs = [(t, proc) for t in (other, ROOT) for proc in (True, False)]
            with concurrent.futures.ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1))) as ex:
                got = dict(zip(runs, ex.map(lambda r: count(r[0], data, r[1]), runs), strict=True))
    print(f"{jobs} jobs x {nodes} nodes x {steps} steps: {events:,} events; "
          "instructions counted by callgrind (processing = run - setup-only run)")  # fmt: skip
    print(f"{'tree':<22} {'run':>15} {'setup only':>15} {'processing':>15} {'per event':>10}")
    per: dict[str, float] = {}
    for name, tree in ((args.against, other), ("this tree", ROOT)):
        run, setup = got[(tree, True)], got[(tree, False)]
        per[name] = (run - setup) / events
        print(f"{name:<22} {run:>15,} {setup:>15,} {run - setup:>15,} {per[name]:>10,.0f}")
    print(f"ratio this tree / {args.against}: {per['this tree'] / per[args.against]:.3f} "
          "(instructions per event; < 1: fewer)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
