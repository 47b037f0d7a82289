"""The model-guided sweep (``spectune sweep --plan guided``): measure only the cells that could still be the best,
predict the others from what the engine already reports (docs/sweep.md, "Guided plan").

The pieces, one module each:

* :mod:`~spectune.sweep.guided.acceptance`: the acceptance length of every num_steps from the per-position acceptance
  of one run (chain drafting);
* :mod:`~spectune.sweep.guided.model`: the step time per sequence ``tau(c, K)`` fitted on the measured cells, and a
  prediction with its interval (residual spread and leverage) for every cell;
* :mod:`~spectune.sweep.guided.seed`: the first four or five cells;
* :mod:`~spectune.sweep.guided.choose`: then one cell at a time, the one of highest expected improvement per
  expected second, while any is worth measuring;
* :mod:`~spectune.sweep.guided.settle`: then more runs of the pairs whose tie rests only on a wide interval;
* :mod:`~spectune.sweep.guided.planner`: :class:`GuidedPlanner`, the object :mod:`spectune.sweep.run` drives.

The windows themselves stop once the decision they serve is settled (:mod:`spectune.sweep.sequential`, on by default
for this plan). Every unmeasured cell ends up in summary.csv with ``predicted`` True.
"""

from spectune.sweep.guided.acceptance import acceptance_lengths
from spectune.sweep.guided.model import Prediction
from spectune.sweep.guided.planner import GuidedPlanner

__all__ = ["GuidedPlanner", "Prediction", "acceptance_lengths"]
