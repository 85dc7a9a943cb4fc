from .gpt_neox import GPTNeoX, num_params
from .spec import build_model, unit_numels

__all__ = ["GPTNeoX", "build_model", "num_params", "unit_numels"]
