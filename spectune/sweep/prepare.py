"""What a sweep folder needs before it opens: its check against the plan, the backend's preflight, the points still
to run, and sweep.json's record (shared by the static sweep, the schedule server's and the p-min cutoffs')."""

from __future__ import annotations

from spectune.backends.base import Backend
from spectune.measure.environment import environment
from spectune.measure.load_settings import ClientTimeouts
from spectune.results.folder import SweepFolder
from spectune.results.point import SweepPoint
from spectune.results.schema import Key, now_iso
from spectune.results.sweep_meta import SweepMeta
from spectune.sweep.plan import NEW_KEYS, SweepListener, SweepPlan


async def prepare_folder(folder: SweepFolder, plan: SweepPlan, backend: Backend, resume: bool, retry_failed: bool,
                   listener: SweepListener, timeouts: ClientTimeouts,
                   preflight: bool = True) -> tuple[list[SweepPoint], list[Key], SweepMeta]:
    """Before a sweep folder opens: its check against ``plan`` (the points kept), the backend's preflight (its
    warnings to ``listener``; ``preflight`` False: a ``--ray`` sweep runs it in each task), the points still to
    run and sweep.json's object.

    Raises:
        UserError: from the folder check or the preflight.
    """
    kept = folder.check(plan.to_json(), resume, retry_failed, NEW_KEYS)
    for warning in await backend.preflight(list(plan.steps)) if preflight else []:
        listener.warning(warning)
    done = {p.key for p in kept}
    meta = sweep_meta(folder, plan, backend)
    meta.client = timeouts.to_json()
    return kept, [k for k in plan.points() if k not in done], meta


def sweep_meta(folder: SweepFolder, plan: SweepPlan, backend: Backend) -> SweepMeta:
    """sweep.json for this run; a resumed sweep keeps ``created`` and moves the earlier runs' environment into
    ``history``."""
    import spectune

    env = environment()
    meta = SweepMeta(spectune.__version__, now_iso(), plan.to_json(), backend.describe(), env["host"],
                     env["versions"])
    old = folder.read_meta()
    if old is not None:
        was = SweepMeta.from_json(old)
        meta.created, meta.resumed = was.created or meta.created, now_iso()
        meta.history = [*(was.history or []), was.run_record()]
    return meta
