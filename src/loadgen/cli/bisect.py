"""`loadgen bisect`: the first commit of a server's repository that made it slower (issue 49; docs/bisect.md).

Between a good and a bad revision (`git rev-list --ancestry-path GOOD..BAD`), each commit measured is
checked out into a worktree of its own (OUTPUT/src/<sha>), built there with `--build` (`{src}` is the
worktree; a commit that does not build is skipped, as git bisect skips), served from `--server`
(`{src}`, `{port}`: grid's machinery, cli/grid.py `CellRunner`, a server per run, stopped by pid)
and measured `--repeat` times with the sweep options given after the command's own. The bad end is
first judged against the good end with the gate's rules (`analysis/gate.py`: the limits and the
run-to-run noise); without a regression between them the search ends there. Each midpoint
(`analysis/bisect_plan.py`) is judged against the good end's runs: a regression beyond a limit is
bad, a pass is good; a verdict the noise leaves open gets more runs (up to `--max-repeat`), and if
it stays open the search stops with the range it could not split.

bisect.json (atomic, after every step) keeps each commit's build, its verdict and why, and the
answer; the measurements are a grid folder (OUTPUT/grid). `--resume OUTPUT` continues: built
commits are not built again, finished runs not run again. Worktrees are removed at the end unless
`--keep-builds`. Exit 0 when the search ends with an answer (the first bad commit, or no regression),
3 when the noise or skipped commits left a range, 1 when an end could not be built or served.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import msgspec
from rich.console import Console

from ..analysis.bisect_plan import BAD, FOUND, GOOD, MEASURE, RANGE, SKIP, UNDECIDED, BisectStep, next_step
from ..core.errors import EXIT_FAILED, EXIT_NOT_ENFORCED, EXIT_OK, ConfigError
from ..core.griddoc import GridCell, GridDocument, GridParamEntry
from ..core.signals import LATCH
from .common import user_errors
from .gate import gate_config, gate_options, noise_for
from .grid import CellRunner, check_measure_args
from .help import command
from .shared import checking_only
from .shared import console as _console

BISECT_FILE = "bisect.json"
NO_REGRESSION, FAILED, RUNNING = "no_regression", "failed", "running"
BUILT, BUILD_FAILED = "ok", "failed"


class BisectCommit(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One commit of the range as bisect.json keeps it (index 0 the good end, the last the bad end)."""

    sha: str
    subject: str
    build: str | None = None  # ok, failed; None: not built
    build_s: float | None = None
    verdict: str | None = None  # good, bad, skip, undecided; None: not measured
    reason: str | None = None  # why: the gate's finding, or the build's or server's failure
    runs: int = 0  # finished measurements


class BisectDocument(msgspec.Struct, kw_only=True):
    schema: str = "loadgen.bisect"
    schema_version: int = 1
    command: list[str] | None = None
    repo: str
    good: str
    bad: str
    build: str
    template: str
    repeat: int
    max_repeat: int
    build_timeout_s: float
    measure_args: list[str] = []  # the sweep's options
    gate: dict[str, Any] = {}  # the gate's options as given (gate_config's parameters; --resume rebuilds it)
    allow_env_change: bool = False  # --allow-env-change
    noise_file: str | None = None  # --noise
    commits: list[BisectCommit] = []
    status: str = RUNNING  # running, found, range, undecided, no_regression, failed
    first_bad: str | None = None
    candidates: list[str] = []  # range/undecided: the commits the first bad one may be
    sentence: str | None = None
    builds: int = 0


def git(repo: Path, *args: str) -> str:
    """git's output; its own message as a ConfigError when it fails."""
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ConfigError(f"git {' '.join(args[:2])}: {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
    return proc.stdout


def commit_range(repo: Path, good: str, bad: str) -> list[BisectCommit]:
    """The good end, the commits after it on the way to the bad end, and the bad end, oldest first."""
    if shutil.which("git") is None:
        raise ConfigError("bisect needs git on the PATH")
    try:
        git(repo, "rev-parse", "--git-dir")
    except ConfigError:
        raise ConfigError(f"--repo {repo}: not a git repository; give the server's clone") from None
    ends = [git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").strip() for rev in (good, bad)]
    if ends[0] == ends[1]:
        raise ConfigError("--good and --bad are the same commit")
    if subprocess.run(["git", "-C", str(repo), "merge-base", "--is-ancestor", *ends]).returncode != 0:
        raise ConfigError(f"--good {good} is not an ancestor of --bad {bad}")
    lines = git(repo, "log", "--reverse", "--ancestry-path", "--format=%H %s", f"{ends[0]}..{ends[1]}").splitlines()
    first = git(repo, "log", "-1", "--format=%H %s", ends[0]).strip()
    return [BisectCommit(sha=sha, subject=subject) for sha, _, subject in
            (line.partition(" ") for line in [first, *lines])]


def check_template(template: str) -> None:
    from ..analysis.grid_cells import placeholders

    used = placeholders(template)
    if "src" not in used:
        raise ConfigError("--server must start the commit's own build: write {src} where its worktree goes, "
                          "e.g. '{src}/build/bin/llama-server -m model.gguf --port {port}'")
    other = sorted(used - {"src", "port", "host"})
    if other:
        raise ConfigError(f"--server: {{{other[0]}}} is not filled by bisect (it fills {{src}}, {{port}}, {{host}})")


def short(sha: str) -> str:
    return sha[:10]


def verdict_of(result) -> tuple[str, str]:  # result: analysis.gate.GateResult
    """A commit's verdict from the gate against the good end: bad on a regression beyond a limit, good
    when every enforced check passed, undecided when the noise left a check open (or nothing could be
    enforced); and the finding in a line."""
    from ..analysis.gate import FAIL, INCONCLUSIVE

    def said(checks) -> str:
        parts = [f"{c.metric} {c.comparison.change:+.1%} at {c.comparison.concurrency:g}" for c in checks
                 if c.comparison.change is not None]
        return ", ".join(parts[:3]) or ", ".join(sorted({c.metric for c in checks}))

    failed = result.with_status(FAIL)
    if failed:
        return BAD, f"regressed: {said(failed)}"
    open_ = result.with_status(INCONCLUSIVE)
    if open_ or result.enforced_nothing:
        return UNDECIDED, f"inside the noise: {said(open_ or result.checks)}"
    return GOOD, "within the limits"


class Bisector:
    """The search over one bisect folder: builds, measurements (a grid cell per commit), verdicts."""

    def __init__(self, root: Path, doc: BisectDocument, grid: GridDocument, err: Console):
        self.root, self.doc, self.grid, self.err = root.resolve(), doc, grid, err
        self.runner = CellRunner(self.root / "grid", grid, err)
        self.config = gate_config(**{k: (tuple(v) if k == "metrics" else v) for k, v in doc.gate.items()})

    def save(self) -> None:
        from ..results.atomic import write_json
        from ..results.grid_file import write_grid

        write_grid(self.root / "grid", self.grid)
        write_json(self.root / BISECT_FILE, msgspec.to_builtins(self.doc))

    def say(self, text: str, style: str | None = None) -> None:
        self.err.print(text, style=style, highlight=False, markup=False, soft_wrap=True)

    def worktree(self, c: BisectCommit) -> Path:
        return self.root / "src" / short(c.sha)

    def build(self, c: BisectCommit) -> bool | None:
        """Whether the commit is built (True), does not build (False: skipped), or None when interrupted."""
        path = self.worktree(c)
        if c.build == BUILD_FAILED:
            return False
        if c.build == BUILT and path.is_dir():
            return True
        if path.exists():  # an interrupted build's, or a removed worktree's leftovers
            subprocess.run(["git", "-C", self.doc.repo, "worktree", "remove", "--force", str(path)], capture_output=True)
            shutil.rmtree(path, ignore_errors=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        git(Path(self.doc.repo), "worktree", "add", "--detach", str(path), c.sha)
        self.say(f"bisect: building {short(c.sha)} {c.subject}")
        started = time.monotonic()
        code = run_build(self.doc.build.replace("{src}", shlex.quote(str(path))), path,
                         path.parent / f"{short(c.sha)}.build.log", self.doc.build_timeout_s)
        if code is None:
            return None
        c.build_s, self.doc.builds = round(time.monotonic() - started, 1), self.doc.builds + 1
        if code != 0:
            tail = build_tail(path.parent / f"{short(c.sha)}.build.log")
            c.build, c.verdict = BUILD_FAILED, SKIP
            c.reason = f"does not build ({'timed out' if code == -1 else f'exit {code}'}): {tail}"
            self.say(f"  skipped: {c.reason}", "yellow")
        else:
            c.build = BUILT
            self.say(f"  built in {c.build_s:.0f} s")
        self.save()
        return c.build == BUILT

    def cell(self, c: BisectCommit) -> GridCell:
        found = next((cell for cell in self.grid.cells if cell.id == short(c.sha)), None)
        if found is None:
            found = GridCell(id=short(c.sha), name=short(c.sha), params={"src": shlex.quote(str(self.worktree(c)))})
            self.grid.cells.append(found)
        return found

    def measure(self, c: BisectCommit, runs: int) -> bool | None:
        """The commit's first `runs` measurements (those not finished yet): True when all ran, False when
        its server failed (the commit is skipped), None when interrupted."""
        from ..results.grid_file import DONE
        from .grid import cell_run_line

        cell = self.cell(c)
        for repeat in range(1, runs + 1):
            if any(e.repeat == repeat and e.status in DONE for e in cell.runs):
                continue
            if LATCH.received:
                return None
            entry = self.runner.run(cell, repeat)
            cell.runs = [e for e in cell.runs if e.repeat != repeat] + [entry]
            self.save()
            if entry.status != "ok":
                if LATCH.received:
                    return None
                c.verdict, c.reason = SKIP, f"its server could not be measured: {entry.reason}"
                self.say(f"  skipped: {c.reason}", "yellow")
                return False
            self.say(f"  {short(c.sha)} run {repeat}: {cell_run_line(self.root / 'grid' / str(entry.run_dir))}")
        c.runs = len(cell.finished_runs())
        return True

    def judge(self, c: BisectCommit) -> tuple[str, str]:
        from ..analysis.gate import run_gate
        from ..results.sides import load_side
        from .gate import env_guard

        def side(commit: BisectCommit):
            return [run for r in self.cell(commit).finished_runs()
                    for run in load_side(self.root / "grid" / str(r.run_dir))]

        allow, noise = self.doc.allow_env_change, self.doc.noise_file
        baseline, candidate = env_guard(side(self.doc.commits[0]), side(c), allow, notes=False)
        floors = noise_for(str(self.root / "grid"), noise) if noise else None
        return verdict_of(run_gate(baseline, candidate, self.config, floors=floors))

    def decide(self, c: BisectCommit) -> bool | None:
        """Measure the commit (built already) and judge it against the good end, with more runs of both
        while the noise leaves it open (to --max-repeat); None when interrupted. False: skipped."""
        good, runs = self.doc.commits[0], self.doc.repeat
        while True:
            for commit in (good, c):  # interleaved: the good end's k-th run, then the commit's
                done = self.measure(commit, runs)
                if done is None:
                    return None
                if not done:
                    if commit is good:
                        raise EndFailed(f"the good end {short(good.sha)} could not be measured again: {good.reason}")
                    return False
            verdict, reason = self.judge(c)
            if verdict != UNDECIDED or runs >= self.doc.max_repeat:
                break
            runs += 1
            self.say(f"  {short(c.sha)}: {reason}; one more run of it and of the good end")
        c.verdict, c.reason = verdict, reason
        self.say(f"  {short(c.sha)} is {verdict}: {reason}", "red" if verdict == BAD else None)
        self.save()
        return True

    def search(self) -> int | None:
        """The ends, then the midpoints; sets the answer and returns the exit code (None: interrupted)."""
        commits = self.doc.commits
        good, bad = commits[0], commits[-1]
        if bad.verdict is None:  # (a search resumed past its ends builds neither again)
            for end, name in ((good, "good"), (bad, "bad")):
                built = self.build(end)
                if built is None:
                    return None
                if not built:
                    raise EndFailed(f"the {name} end {short(end.sha)} {end.reason}")
            good.verdict, good.reason = GOOD, "the good end"
            self.say(f"bisect: the bad end {short(bad.sha)} against the good end {short(good.sha)}")
            decided = self.decide(bad)
            if decided is None:
                return None
            if not decided:
                raise EndFailed(f"the bad end {short(bad.sha)}: {bad.reason}")
        if bad.verdict != BAD:
            return self.finish_ends()
        while (step := next_step([c.verdict for c in commits])).status == MEASURE:
            assert step.index is not None
            c = commits[step.index]
            left = step.high - step.low - 1
            self.say(f"bisect: {left} commit(s) left between {short(commits[step.low].sha)} and "
                     f"{short(commits[step.high].sha)}; measuring {short(c.sha)} {c.subject}")
            built = self.build(c)
            if built is None or (built and self.decide(c) is None):
                return None
        return self.finish(step)

    def finish_ends(self) -> int:
        bad = self.doc.commits[-1]
        if bad.verdict == SKIP:
            raise EndFailed(f"the bad end {short(bad.sha)}: {bad.reason}")
        if bad.verdict == GOOD:
            self.answer(NO_REGRESSION, [], f"no regression between good {short(self.doc.good)} and bad "
                                           f"{short(self.doc.bad)}: the bad end is {bad.reason} of the good end")
            return EXIT_OK
        self.answer(UNDECIDED, [bad.sha], f"the bad end cannot be told from the good end ({bad.reason}, after "
                                          f"{bad.runs} runs each): measure longer, or widen the limits")
        return EXIT_NOT_ENFORCED

    def finish(self, step: BisectStep) -> int:
        commits = self.doc.commits
        first = commits[step.high]
        if step.status == FOUND:
            self.doc.first_bad = first.sha
            self.answer(FOUND, [first.sha], f"first bad commit: {short(first.sha)} {first.subject} ({first.reason}; "
                                            f"its parent {short(commits[step.low].sha)} is {commits[step.low].reason})")
            return EXIT_OK
        shas = [commits[i].sha for i in step.candidates]
        why = ("the commits between did not build or serve" if step.status == RANGE
               else "the noise left a commit between undecided")
        self.answer(step.status, shas, f"the first bad commit is one of {', '.join(short(s) for s in shas)}: {why}")
        return EXIT_NOT_ENFORCED

    def answer(self, status: str, candidates: list[str], sentence: str) -> None:
        self.doc.status, self.doc.candidates, self.doc.sentence = status, candidates, sentence
        self.save()


class EndFailed(Exception):
    """An end of the range could not be built, served or measured: no search without both."""


def run_build(cmd: str, cwd: Path, log: Path, timeout_s: float) -> int | None:
    """The build command's exit code (-1 when it ran past `timeout_s`), None when loadgen was interrupted;
    its process group is killed on either."""
    import os
    import signal

    from ..core.processes import start_tied

    with log.open("wb") as out:
        proc = start_tied(["bash", "-c", cmd], cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            if LATCH.received or time.monotonic() > deadline:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
                return None if LATCH.received else -1


def build_tail(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


@command("bisect", context_settings={"ignore_unknown_options": True})
@click.option("--repo", default=".", show_default=True, type=click.Path(file_okay=False, exists=True),
              help="The server's git repository.")
@click.option("--good", help="A revision that was fast (git's name for it: a sha, tag or branch).")
@click.option("--bad", help="A later revision that is slow.")
@click.option("--build", "build", help="The build command, run in each commit's worktree ({src} is its path).")
@click.option("--server", "template", help="The server's command line: {src} the commit's worktree, {port} a free port.")
@click.option("--repeat", type=click.IntRange(2, 20), default=3, show_default=True,
              help="Runs per commit (interleaved with the good end's); 2 or more to know the noise.")
@click.option("--max-repeat", type=click.IntRange(2, 50), default=5, show_default=True,
              help="Runs a commit may get while the noise leaves its verdict open.")
@click.option("--build-timeout", "build_timeout_s", type=click.FloatRange(min=1), default=3600, show_default=True,
              help="Seconds a build may take before the commit counts as not building.")
@click.option("--wait-ready", "wait_ready_s", type=click.FloatRange(min=0), default=600, show_default=True,
              help="Seconds a server may take to load its model.")
@click.option("--keep-builds", is_flag=True, help="Keep each commit's worktree and build after the search.")
@click.option("--output", type=click.Path(file_okay=False), help="Bisect folder [default: results/<UTC time>-bisect].")
@click.option("--force", is_flag=True, help="Overwrite a folder that already holds results.")
@click.option("--resume", type=click.Path(file_okay=False), help="Continue an interrupted search in this folder.")
@gate_options
@click.argument("measure_args", nargs=-1, type=click.UNPROCESSED, metavar="[SWEEP OPTIONS]")
def bisect_command(repo, good, bad, build, template, repeat, max_repeat, build_timeout_s, wait_ready_s, keep_builds,
                   output, force, resume, measure_args, allow_env_change=False, noise_file=None, **gate) -> None:
    """Find the first commit that made the server slower: build, serve and measure midpoints, judged by the gate."""
    with user_errors():
        if resume:
            root, doc = Path(resume), load_bisect(Path(resume))
            if any((good, bad, build, template, measure_args)):
                raise ConfigError("--resume continues a search as it was given; leave out --good, --bad, --build, "
                                  "--server and the sweep options")
        else:
            if not (good and bad and build and template):
                raise ConfigError("give --good REV --bad REV --build 'CMD' --server 'COMMAND with {src} and {port}' "
                                  "(or --resume DIR)")
            check_template(template)
            gate_config(**gate)  # the gate's options are checked now, not after the first builds
            commits = commit_range(Path(repo).resolve(), good, bad)
            doc = BisectDocument(command=command_line(), repo=str(Path(repo).resolve()), good=commits[0].sha,
                                 bad=commits[-1].sha, build=build, template=template, repeat=repeat,
                                 max_repeat=max(max_repeat, repeat), build_timeout_s=build_timeout_s,
                                 measure_args=list(measure_args), commits=commits,
                                 gate={k: (list(v) if k == "metrics" else v) for k, v in gate.items()},
                                 allow_env_change=allow_env_change, noise_file=noise_file)
            root = new_folder(output, force)
    check_measure_args("sweep", tuple(doc.measure_args))
    if checking_only():
        return
    grid = grid_of(root, doc, wait_ready_s)
    LATCH.install()
    sys.exit(run_search(root, doc, grid, keep_builds))


def command_line() -> list[str]:
    from ..results.writer import command_line as line

    return line()


def new_folder(output: str | None, force: bool) -> Path:
    from ..results.writer import default_dir, prepare_dir

    root = prepare_dir(Path(output) if output else default_dir(Path("results"), "bisect"), force)
    if (root / BISECT_FILE).exists() and not force:
        raise ConfigError(f"{root} already holds a bisect; continue it with --resume {root} or add --force")
    shutil.rmtree(root / "grid", ignore_errors=True)
    return root


def load_bisect(root: Path) -> BisectDocument:
    try:
        return msgspec.json.decode((root / BISECT_FILE).read_bytes(), type=BisectDocument)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{root}: no bisect to continue ({exc})") from None


def grid_of(root: Path, doc: BisectDocument, wait_ready_s: float) -> GridDocument:
    """The grid that holds the measurements: the one in the folder, or a new one (a cell per commit measured)."""
    from ..results.grid_file import is_grid, load_grid, write_grid

    if is_grid(root / "grid"):
        return load_grid(root / "grid")
    grid = GridDocument(command=doc.command, template=doc.template, params=[GridParamEntry("src", [])],
                        repeat=doc.repeat, measure="sweep", measure_args=doc.measure_args, wait_ready_s=wait_ready_s,
                        cells=[])
    (root / "grid").mkdir(parents=True, exist_ok=True)
    write_grid(root / "grid", grid)
    return grid


def run_search(root: Path, doc: BisectDocument, grid: GridDocument, keep_builds: bool) -> int:
    """The search, its answer printed; the worktrees removed at the end unless kept (or interrupted)."""
    err = _console(stderr=True)
    between = len(doc.commits) - 2
    err.print(f"bisect: {between} commit(s) between good {short(doc.good)} and bad {short(doc.bad)}; "
              f"{doc.repeat} runs each, judged by the gate against the good end", highlight=False)
    bisector = Bisector(root, doc, grid, err)
    try:
        with user_errors():
            code = bisector.search()
    except EndFailed as exc:
        bisector.answer(FAILED, [], str(exc))
        code = EXIT_FAILED
    print_bisect(doc)
    if code is None:
        err.print(f"bisect: interrupted; continue with loadgen bisect --resume {root}", highlight=False)
        return LATCH.exit_code or EXIT_FAILED
    if not keep_builds:
        for c in doc.commits:
            path = root / "src" / short(c.sha)
            if path.exists():
                subprocess.run(["git", "-C", doc.repo, "worktree", "remove", "--force", str(path)], capture_output=True)
                shutil.rmtree(path, ignore_errors=True)
    err.print(f"bisect: {root} ({doc.builds} build(s))", highlight=False)
    return code


def print_bisect(doc: BisectDocument) -> None:
    from rich.table import Table

    table = Table(title="bisect: the commits measured")
    for name in ("commit", "subject", "build s", "runs", "verdict", "why"):
        table.add_column(name)
    for c in doc.commits:
        if c.build is not None or c.verdict is not None:
            table.add_row(short(c.sha), c.subject[:40], f"{c.build_s:.0f}" if c.build_s is not None else "-",
                          str(c.runs), c.verdict or "-", c.reason or "")
    console = _console()
    console.print(table)
    if doc.sentence:
        console.print(doc.sentence, highlight=False, markup=False, soft_wrap=True)
