"""Training: the runtime (rank, device, process group), what each step consumes (datasets,
micro-batches, loss, learning rate), what a run starts from (its plan, chosen before the Trainer
is built), one optimizer step, the checkpointer, the log window and the training loop."""

from .batches import Batches, build_data, dataset_num_samples, learning_rate, loss_fn
from .checkpoints import Checkpointer, TrainState
from .runtime import Runtime, seed_everything, setup_runtime
from .start import RunStart, build_engine, choose_plan, new_comm
from .step import run_step
from .trainer import Trainer, TrainingError

__all__ = [
    "Batches",
    "Checkpointer",
    "RunStart",
    "Runtime",
    "TrainState",
    "Trainer",
    "TrainingError",
    "build_data",
    "build_engine",
    "choose_plan",
    "dataset_num_samples",
    "learning_rate",
    "loss_fn",
    "new_comm",
    "run_step",
    "seed_everything",
    "setup_runtime",
]
