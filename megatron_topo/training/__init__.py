"""Training: the runtime (rank, device, process group), what each step consumes (datasets,
micro-batches, loss, learning rate), the trainer's checkpoint side and the training loop."""
from .batches import Batches, build_data, dataset_num_samples, learning_rate, loss_fn
from .checkpoints import TrainerCheckpoints, TrainState
from .runtime import Runtime, seed_everything, setup_runtime
from .trainer import Trainer, TrainingError, build_engine

__all__ = ["Batches", "Runtime", "TrainState", "Trainer", "TrainerCheckpoints", "TrainingError", "build_data",
           "build_engine", "dataset_num_samples", "learning_rate", "loss_fn", "seed_everything", "setup_runtime"]
