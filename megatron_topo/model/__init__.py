from .gpt_neox import GPTNeoX, build_model, num_params

__all__ = ["GPTNeoX", "build_model", "num_params"]
