"""What the two head-training pipelines (``spectune draft train``, :mod:`spectune.draft.pipeline`, and ``spectune
draft accept-train``, :mod:`spectune.draft.acceptance_pipeline`) share about their data: the target that answers the
prompts, the work folder, the prompt and response lengths and the generation batch (:class:`DataOptions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spectune.backends.local.engine.loop import Engine

__all__ = ["DataOptions"]


@dataclass(kw_only=True)
class DataOptions:
    """Where and how the target generates a head's training data.

    Attributes:
        model: target (None: the embedded SmolLM2-135M-Instruct).
        work_dir: folder for prompts, responses, features and what the pipeline builds from them.
        max_new_tokens: response length cap, tokens.
        max_prompt_tokens: longer prompts are skipped (chat template applied).
        batch: concurrent sequences while generating responses.
    """

    model: str | None
    work_dir: Path
    max_new_tokens: int
    max_prompt_tokens: int
    batch: int = 64

    @property
    def max_len(self) -> int:
        """Tokens of the longest prompt and response: ``max_prompt_tokens + max_new_tokens``."""
        return self.max_prompt_tokens + self.max_new_tokens

    def response_engine(self) -> Engine:
        """The bundled engine that answers the prompts: the target alone (no draft head), bfloat16, ``batch``
        sequences of :attr:`max_len` tokens (:func:`spectune.backends.local.build.build_engine`).

        Raises:
            UserError: the target cannot be loaded.
        """
        from spectune.backends.local.build import build_engine
        from spectune.backends.local.options import EngineOptions

        return build_engine(EngineOptions(model=self.model, draft="none", num_steps=0, dtype="bfloat16",
                                          max_num_seqs=self.batch, max_model_len=self.max_len))
