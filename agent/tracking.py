"""A second logger beside TensorBoard: Weights & Biases (``track``, ``--track``).

The run's scalars (every one TensorBoard gets, against ``global_step``), its resolved
config, its final results, and the evaluation videos of ``--eval RUN --video DIR`` go to
one W&B run, whose id is kept in ``RUN_DIR/wandb_id``: a resumed run goes on logging into
it. TensorBoard stays the default and the only logger a run needs; this one is an extra
(``pip install -e ".[track]"``) and works offline (``WANDB_MODE=offline``), as CleanRL's
``--track``.

W&B's own step only grows, and a run killed outright may have logged past its last
checkpoint: every value is logged against ``global_step`` instead (``define_metric``), so
the steps a resumed run logs again are kept, not dropped.

A W&B run that cannot start (no API key and no terminal to ask for one, a key W&B
refuses, no network) is a :class:`UserError` naming both ways on, ``wandb login`` and
``WANDB_MODE=offline``: the run does not start without the logger it was asked for,
and a new run's directory is taken away again (:func:`agent.train.train`).
"""

from __future__ import annotations

import importlib
import uuid
from pathlib import Path
from typing import Any

from agent.errors import UserError
from agent.usage import install_hint

__all__ = ["ID_FILE", "Tracker", "require_wandb"]

ID_FILE = "wandb_id"  # in the run directory: the W&B run that a resume continues


def require_wandb() -> Any:
    """The ``wandb`` module, or a :class:`UserError` naming the extra that installs it."""
    try:
        return importlib.import_module("wandb")
    except ImportError:
        raise UserError(
            f"track (--track) sends the run to Weights & Biases, which is not installed: "
            f"{install_hint('track')}, or drop --track"
        ) from None


def _cannot_start(error: BaseException) -> str:
    """The one line for a W&B run that ``wandb.init`` could not start (``error``): the
    two ways to go on, logged in or offline."""
    reason = str(error).splitlines()[0].rstrip(".") if str(error) else type(error).__name__
    return (
        f"track (--track) could not start a Weights & Biases run ({reason}): log in once "
        "with `wandb login` (or set WANDB_API_KEY), or keep the run on this machine with "
        "WANDB_MODE=offline (`wandb sync` uploads it later), or drop --track"
    )


class Tracker:
    """One run directory's W&B run: started (or resumed) at construction.

    Args:
        run_dir: the run directory (its name is the W&B run's name; its ``wandb_id`` file
            holds the id).
        project, entity: where the run goes (``wandb_project``, ``wandb_entity``).
        config: the resolved config, shown as the run's config.
    """

    def __init__(
        self,
        run_dir: Path,
        project: str,
        entity: str | None,
        config: dict[str, Any] | None = None,
    ) -> None:
        wandb = require_wandb()
        self._wandb = wandb
        id_file = Path(run_dir) / ID_FILE
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:8]
        try:
            self.run = wandb.init(
                project=project,
                entity=entity,
                name=Path(run_dir).name,
                id=run_id,
                resume="allow",
                dir=str(run_dir),
                config=config,
                reinit="create_new",
            )
        except wandb.errors.Error as e:  # no API key (and no terminal to ask for one), ...
            raise UserError(_cannot_start(e)) from None
        id_file.write_text(run_id + "\n")
        self.run.define_metric("global_step")
        self.run.define_metric("*", step_metric="global_step")

    def log(self, step: int, values: dict[str, float]) -> None:
        """``values`` (TensorBoard's tags) at env step ``step``."""
        self.run.log({**values, "global_step": step})

    def summary(self, results: dict[str, float]) -> None:
        """The run's final results, shown beside its config."""
        for key, value in results.items():
            self.run.summary[key] = value

    def videos(self, paths: list[Path], step: int | None = None) -> None:
        """Evaluation videos (mp4), each under ``videos/<file name>``."""
        wandb = self._wandb
        values: dict[str, Any] = {
            f"videos/{p.stem}": wandb.Video(str(p), format="mp4") for p in paths
        }
        if step is not None:
            values["global_step"] = step
        self.run.log(values)

    def close(self) -> None:
        self.run.finish()
