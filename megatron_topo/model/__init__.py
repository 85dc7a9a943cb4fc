from .gpt_neox import GPTNeoX, build_model, num_params, unit_numels

__all__ = ["GPTNeoX", "build_model", "num_params", "unit_numels"]
