"""What a sample costs, epoch by epoch: CPU per process kind, staged and direct, beside the copy's physics.

    .venv/bin/python benchmarks/loaders/ledger.py --json docs/ledger.json
    .venv/bin/python benchmarks/loaders/ledger.py --samples 1536 --processes 4 --dirs tmpfs --rounds 1

The case of torch_dropin.py: an ImageFolder of 256x256 JPEGs (115 KB)
behind the emulator at ``--open-ms`` an open, torchvision's training
transforms, batch 32, ``--epochs`` epochs, no training step. For each
dataset size of ``--samples``, each N of ``--processes`` and each staging
directory of ``--dirs`` (``default``: nothing set, so stager stages under
``$TMPDIR`` or /tmp; ``tmpfs``: a size-limited tmpfs mounted here, where
creating a file is cheap), alternating, ``--rounds`` rounds:
``DataLoader(num_workers=N, persistent_workers=True)`` and the one-line
``StagedLoader`` (``num_workers=N``, nothing else set but the directory).

At each epoch's end the run reads every process's own CPU (``utime +
stime``) by kind (the training process, the readers or DataLoader's
workers, the prefetchers, the emulator's daemon), the readers' and the
prefetchers' minor page faults, and the machine's busy ticks (``/proc/stat``: everything, the
kernel's own work included), so each epoch's CPU a sample is known per kind. Beside them, measured in the same
run, the physics of a staged copy: opening and reading one file through
the emulator (the client's and the daemon's CPU), creating, writing and
renaming one in each staging directory, reading it back, and the
transforms on a local file; then the same files copied in threads three
ways (by hand, by stager's fetch with its checks, by one prefetcher with
its bookkeeping), so each layer's CPU a file is known apart from the
contention of a full run. Epoch 1's CPU above epoch 2's holds what each
staged file costs and what the job pays once (the probe, forking the
workers, the readers' shared memory faulted in): two dataset sizes tell
them apart, and the last table gives both.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from torch_dropin import BATCH, cpu_of, emulated_jpeg_folder, one_run_arguments, transforms  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
METHODS = ("dataloader", "stager", "stager-off")
FETCH_THREADS = 24  # files in flight in the threaded copies (auto gives a prefetcher 20-30 here)


def busy_seconds():
    """The machine's busy CPU seconds so far, every core (``/proc/stat``: all but idle and iowait)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICK


def minor_faults(pid):
    """Pages process ``pid`` has faulted in so far without reading a disk (``minflt``), or 0 once gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return 0


def snapshot(daemon):
    """CPU seconds so far: ``{kind: seconds}`` and each live descendant's ``[name, CPU s, minor faults]``."""
    from stager.bench.cpu import descendants, readings

    own = os.times()
    procs = readings(descendants(os.getpid()))
    return {"rank": own.user + own.system, "emulator": cpu_of(daemon), "machine": busy_seconds(),
            "procs": {str(pid): [name, cpu, minor_faults(pid)] for pid, (name, cpu) in procs.items()}}


def epoch_cpu(before, after):
    """``{kind: CPU seconds}`` between two snapshots, ``reader_faults``: the readers' (or DataLoader
    workers') minor faults, and ``prefetcher_faults``; a worker is read at both (persistent workers)."""
    out = {kind: after[kind] - before[kind] for kind in ("rank", "emulator", "machine")}
    out["readers"] = out["prefetchers"] = 0.0
    faults = {"readers": 0, "prefetchers": 0}
    for pid, (name, cpu, minflt) in after["procs"].items():
        _, cpu_then, minflt_then = before["procs"].get(pid, [name, 0.0, 0])
        kind = "prefetchers" if name.startswith("stager-prefetch") else "readers"
        out[kind] += cpu - cpu_then
        faults[kind] += minflt - minflt_then
    out = {kind: round(value, 3) for kind, value in out.items()}
    out["reader_faults"], out["prefetcher_faults"] = faults["readers"], faults["prefetchers"]
    return out


def one(args):
    """One method in this process: each epoch's seconds and CPU seconds by kind, as JSON on stdout."""
    import torch
    from torch.utils.data import DataLoader

    from iterators.pytorch import StagedLoader
    from torchvision.datasets import ImageFolder  # noqa: E402  (after iterators.pytorch)

    torch.manual_seed(0)
    train = ImageFolder(args.data, transform=transforms())
    if args.one == "dataloader":
        loader = DataLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n, persistent_workers=True)
    else:  # the one-line change; ``default``: not even the staging directory set
        staging = {"local_dir": args.local} if args.local else {}
        if args.one == "stager-off":  # epoch 2 decodes as epoch 1 does: what epoch 1 adds is the copy's alone
            staging["decoded"] = "off"
        loader = StagedLoader(train, batch_size=BATCH, shuffle=True, num_workers=args.n,
                              config={"staging": staging} if staging else None)
    epochs, cpu = [], []
    mark = snapshot(args.daemon)
    for _ in range(args.epochs):
        begin, samples = time.perf_counter(), 0
        for _, labels in loader:
            samples += len(labels)
        epochs.append(time.perf_counter() - begin)
        now = snapshot(args.daemon)
        cpu.append(epoch_cpu(mark, now))
        mark = now
        assert samples == len(train), (samples, len(train))
    if hasattr(loader, "close"):
        loader.close()
    print(json.dumps({"epochs": epochs, "cpu": cpu}))


def run(method, n, mnt, local, daemon, args):
    cmd = [sys.executable, os.path.abspath(__file__), "--one", method, "--n", str(n), "--data", mnt,
           "--local", local or "", "--epochs", str(args.epochs), "--daemon", str(daemon)]
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if proc.returncode:
        sys.exit(f"{method} N={n} failed:\n{proc.stdout}{proc.stderr}")
    return json.loads(proc.stdout.splitlines()[-1])


def physics(mnt, daemon, dirs, files=200):
    """CPU milliseconds a file of the copy's parts, one thread, then the whole copy in threads: ``{part: ms}``."""
    names = sorted(os.path.join(root, f) for root, _, fs in os.walk(mnt) for f in fs)[:files]
    out = {}
    before_c, before_d = time.process_time(), cpu_of(daemon)
    payloads = []
    for name in names:
        with open(name, "rb", buffering=0) as fh:
            payloads.append(fh.read())
    out["source open + read: client"] = (time.process_time() - before_c) / len(names) * 1000
    out["source open + read: emulator"] = (cpu_of(daemon) - before_d) / len(names) * 1000
    for label, where in dirs.items():
        with tempfile.TemporaryDirectory(dir=where) as scratch:
            begin = time.process_time()
            for i, data in enumerate(payloads):
                tmp, final = os.path.join(scratch, f".{i}.part"), os.path.join(scratch, f"{i}.jpg")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.write(fd, data)
                os.close(fd)
                os.rename(tmp, final)
            out[f"create + write + rename: {label}"] = (time.process_time() - begin) / len(payloads) * 1000
            begin = time.process_time()
            for i in range(len(payloads)):
                with open(os.path.join(scratch, f"{i}.jpg"), "rb", buffering=0) as fh:
                    fh.read()
            out[f"read back: {label}"] = (time.process_time() - begin) / len(payloads) * 1000
        out.update(threaded_copies(mnt, names, label, where))
    return {part: round(ms, 3) for part, ms in out.items()}


def threaded_copies(mnt, names, label, where):
    """CPU ms a file of the same copy in ``FETCH_THREADS`` threads: by hand, by stager's fetch, by a prefetcher.

    By hand: open, ``sendfile``, create and rename, nothing else. Stager's
    fetch adds its checks (the catalog's size and time against the open
    file's, before and after) and its publishing (a temporary name, the
    source's modification time, the rename). A prefetcher adds its threads'
    bookkeeping: its task queue, each file's clocks and the replies.
    """
    from stager.engine.messages import StageTask
    from stager.engine.workers.inflight import InFlight
    from stager.engine.workers.loops import _fetch
    from stager.sources import PosixSource

    files = []
    for index, name in enumerate(names):
        st = os.stat(name)
        files.append((index, os.path.relpath(name, mnt), st.st_size, st.st_mtime_ns))
    source = PosixSource(mnt)

    def by_hand(dst, file):
        src = os.open(os.path.join(mnt, file[1]), os.O_RDONLY)
        try:
            tmp = os.path.join(dst, f".{file[0]}.part")
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            while os.sendfile(out, src, None, 1 << 20):
                pass
            os.close(out)
            os.rename(tmp, os.path.join(dst, f"{file[0]}.jpg"))
        finally:
            os.close(src)

    def prefetcher(dst):
        tasks = [StageTask(t, 0, t, files[i:i + BATCH // 4]) for t, i in enumerate(range(0, len(files), BATCH // 4))]
        replies = []  # its fetch threads reply here, as to its pipe
        InFlight(0, type("Pipe", (), {"send": staticmethod(replies.append)}), threading.Event(), source, dst,
                 FETCH_THREADS, _fetch).run(iter(tasks))
        failed = [msg for msg in replies if type(msg).__name__ != "Staged"]
        if failed or len(replies) != len(tasks):
            sys.exit(f"the prefetcher's copies failed: "
                     f"{failed[:1] or f'{len(replies)} replies for {len(tasks)} tasks'}")

    ways = {"by hand": lambda dst: _each(by_hand, dst, files),
            "stager's fetch": lambda dst: _each(lambda d, f: _fetch(source, d, *f), dst, files),
            "one prefetcher": prefetcher}
    out = {}
    for way, copy in ways.items():
        with tempfile.TemporaryDirectory(dir=where) as scratch:
            begin = time.process_time()
            copy(scratch)
            out[f"{FETCH_THREADS} threads, {way}: {label}"] = (time.process_time() - begin) / len(files) * 1000
    return out


def _each(copy, dst, files):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(FETCH_THREADS) as pool:
        for _ in pool.map(lambda file: copy(dst, file), files):
            pass


@contextlib.contextmanager
def staging_dirs(work, which, samples):
    """``{label: directory}``: ``default`` (where stager stages when nothing is set: ``$TMPDIR`` or /tmp),
    ``tmpfs`` (a size-limited tmpfs mounted here, removed afterwards)."""
    from stager.storage.jobdir import named_local_base

    out, mounted = {}, None
    if "default" in which:
        out["default"] = named_local_base(None)[0]
    if "tmpfs" in which:
        mounted = os.path.join(work, "tmpfs")
        os.mkdir(mounted)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={4 * samples * 115_000 // (1 << 20) + 64}m,mode=0700",
                        "tmpfs", mounted], check=True)
        out["tmpfs"] = mounted
    try:
        yield out
    finally:
        if mounted:
            subprocess.run(["umount", mounted], check=False)


def per_sample(row, kind, epoch, samples):
    return row["cpu"][epoch][kind] / samples * 1000


def median_run(runs):
    """The run whose whole-job time is the median of ``runs`` (its figures stay together)."""
    return sorted(runs, key=lambda r: sum(r["epochs"]))[len(runs) // 2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", default="1536,3072",
                        help="dataset sizes; two or more split epoch 1's extra CPU into per job and per file")
    parser.add_argument("--open-ms", type=float, default=10.0)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--processes", default="2,4,8", help="N: DataLoader's workers, StagedLoader's num_workers")
    parser.add_argument("--dirs", default="tmpfs,default", help="staging directories: tmpfs, default")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", help="write every run here")
    one_run_arguments(parser)
    parser.add_argument("--daemon", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--methods", default=",".join(METHODS),
                        help="dataloader; stager (the defaults); stager-off (staging.decoded: off)")
    args = parser.parse_args()
    unknown = set(args.methods.split(",")) - set(METHODS)
    if unknown:
        parser.error(f"unknown --methods {sorted(unknown)}: choose from {', '.join(METHODS)}")
    if args.one:
        return one(args)

    counts = [int(x) for x in args.processes.split(",")]
    which = args.dirs.split(",")
    sizes = [int(x) for x in str(args.samples).split(",")]
    results = {"samples": sizes, "open_ms": args.open_ms, "epochs": args.epochs, "runs": []}
    with contextlib.ExitStack() as stack:
        folders = {size: stack.enter_context(emulated_jpeg_folder(size, args.open_ms, f"stager-ledger-{size}-"))
                   for size in sizes}
        work, mnt, daemon, d = folders[sizes[0]]
        dirs = stack.enter_context(staging_dirs(work, which, max(sizes)))
        results["physics"] = physics(mnt, daemon, dirs)
        results["physics"]["transforms on a local file"] = round(d * 1000, 3)
        for r in range(args.rounds):
            for size in sizes:
                _, mnt, daemon, _ = folders[size]
                for n in counts:
                    for label, where in dirs.items():
                        for method in args.methods.split(","):
                            if label == "default":  # stager makes (and removes) its own directory there
                                row = run(method, n, mnt, None, daemon, args)
                            else:
                                local = tempfile.mkdtemp(prefix=f"{method}-", dir=where)
                                row = run(method, n, mnt, local, daemon, args)
                                subprocess.run(["rm", "-rf", local], check=False)
                            row.update(method=method, n=n, dir=label, round=r, samples=size)
                            results["runs"].append(row)
                            print(f"round {r} {size} samples N={n} {label} {method}: "
                                  + " / ".join(f"{s:.2f}" for s in row["epochs"]) + " s", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    report(results)


def _thousands(counts):
    """``a / b / c`` in thousands, or ``-`` where a run did not count them (an older JSON)."""
    return " / ".join(f"{c / 1000:.0f}" for c in counts) if None not in counts else "-"


def extra_seconds(row, kind):
    """CPU seconds of ``kind`` that epoch 1 spent above epoch 2."""
    return row["cpu"][0][kind] - row["cpu"][1][kind]


def report(results):
    sizes, epochs = results["samples"], results["epochs"]
    rounds = max(r["round"] for r in results["runs"]) + 1
    print(f"JPEGs (256x256, 115 KB) behind the emulator at {results['open_ms']:g} ms an open; batch {BATCH}; "
          f"{epochs} epochs; each row the run with the median total of its {rounds} rounds\n")
    print("The copy's physics here (CPU ms a file, one thread; then the whole copy in threads, over the same "
          "files, read a second time):\n")
    print("| part | ms |\n|---|---:|")
    for part, ms in results["physics"].items():
        print(f"| {part} | {ms:.3f} |")
    groups = {}
    for row in results["runs"]:
        groups.setdefault((row["samples"], row["n"], row["dir"], row["method"]), []).append(row)
    print("\n| samples | N | staging dir | method | epoch s | machine CPU ms a sample, by epoch | rank | readers | "
          "prefetchers | emulator |")
    print("|---:|---:|---|---|---|---|---|---|---|---|")
    for (size, n, where, method), runs in sorted(groups.items()):
        row = median_run(runs)
        cells = [" / ".join(f"{per_sample(row, kind, e, size):.2f}" for e in range(epochs))
                 for kind in ("machine", "rank", "readers", "prefetchers", "emulator")]
        print(f"| {size} | {n} | {where} | {method} | {' / '.join(f'{s:.2f}' for s in row['epochs'])} | "
              + " | ".join(cells) + " |")
    print("\nEpoch 1 above epoch 2, CPU ms a sample (medians over rounds); the machine's epoch 1 above "
          "DataLoader's epoch 1 in the same rounds (the direct read's); and the pages the readers and the "
          "prefetchers faulted in (minor faults, thousands; the median run's). With the decoded tier (`stager`), "
          "epoch 2 decodes nothing, so its epoch 1 above epoch 2 holds the decoding too:\n")
    print("| samples | N | staging dir | method | machine | rank | readers | prefetchers | emulator | "
          "machine above DataLoader's epoch 1 | readers' faults, by epoch | prefetchers' faults, by epoch |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for (size, n, where, method), runs in sorted(groups.items()):
        extra = [statistics.median(extra_seconds(r, kind) / size * 1000 for r in runs)
                 for kind in ("machine", "rank", "readers", "prefetchers", "emulator")]
        direct = {r["round"]: r for r in groups.get((size, n, where, "dataloader"), ())}
        above = [(r["cpu"][0]["machine"] - direct[r["round"]]["cpu"][0]["machine"]) / size * 1000
                 for r in runs if r["round"] in direct]
        extra.append(statistics.median(above) if above else None)
        print(f"| {size} | {n} | {where} | {method} | "
              + " | ".join("-" if x is None else f"{x:+.2f}" for x in extra) + " | "
              + " | ".join(_thousands([e.get(key) for e in median_run(runs)["cpu"]])
                           for key in ("reader_faults", "prefetcher_faults")) + " |")
    if len(sizes) < 2:
        return
    small, large = min(sizes), max(sizes)
    print(f"\nEpoch 1's extra CPU split into what each file costs and what the job costs once, from {small} and "
          f"{large} samples (medians over rounds; per file: ms, once: s):\n")
    print("| N | staging dir | method | " + " | ".join(f"{k} per file | {k} once" for k in ("machine", "rank", "readers",
                                                                                           "prefetchers")) + " |")
    print("|---:|---|---|" + "---:|" * 8)
    for (size, n, where, method), runs in sorted(groups.items()):
        if size != small or (large, n, where, method) not in groups:
            continue
        cells = []
        for kind in ("machine", "rank", "readers", "prefetchers"):
            a = statistics.median(extra_seconds(r, kind) for r in runs)
            b = statistics.median(extra_seconds(r, kind) for r in groups[(large, n, where, method)])
            per_file = (b - a) / (large - small)
            cells += [f"{per_file * 1000:+.2f}", f"{a - per_file * small:+.2f}"]
        print(f"| {n} | {where} | {method} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
