"""Choose the training precision (bf16 / fp16 / fp32, and TF32) from what the device supports.

One pure function, `resolve_precision(requested, device)`, turns a request (`"auto"`, `"bf16"`,
`"fp16"`, `"fp32"`) and a `DeviceInfo` into a `PrecisionChoice`: the `bf16` / `fp16` / `use_cpu` /
`tf32` values to put on `TrainingArguments`, with a one-line reason to log. `detect_device()` is the
only part that looks at the machine, so every device situation is testable with a hand-built
`DeviceInfo` and no GPU.

Rules (design decisions, each one a line in `resolve_precision`):

- `auto`: bf16 on accelerators with native bf16 (NVIDIA compute capability >= 8.0: A100, H100,
  H200, RTX 30xx/40xx); fp16 with dynamic loss scaling on older CUDA GPUs (V100, T4); fp32 on CPU
  and on Apple MPS (bf16 is emulated on M1/M2 and fp16 autocast there is not worth a surprise).
  bf16 keeps fp32's exponent range, so it needs no loss scaling (Kalamkar et al. 2019, "A Study of
  BFLOAT16 for Deep Learning Training"); fp16 needs it (Micikevicius et al. 2018, "Mixed Precision
  Training"). The Trainer's Accelerator adds the GradScaler for fp16, and `clip_grad_norm_` unscales
  the gradients before clipping, so clipping thresholds mean the same in fp16 and fp32.
- `bf16` on CPU: the Trainer raises unless `use_cpu=True`, so the choice sets `use_cpu` and says so.
  bf16 on a CUDA GPU without native bf16 is an error (the Trainer would run it emulated, slowly).
- `fp16` on CPU: the Trainer silently trains in fp32. Here it falls back to fp32 *with a warning*
  (so a GPU recipe still smoke-tests on a laptop), or raises with `strict=True`.
- `fp32`: no autocast; TF32 is left at torch's default unless asked for, since the user asked
  for full fp32 matmuls.
- TF32 (`tf32=None`, the default, means auto): on for GPUs that have it (compute capability >= 8.0)
  whenever mixed precision or `auto` is in play; the matmuls left outside autocast then run on
  tensor cores. `tf32=True` on a device without TF32 is an error (the Trainer raises later, with
  less context).

`effective_request` merges the ways a user can ask for a precision (the `precision` field, the
Trainer's own `bf16` / `fp16` flags, `accelerate launch --mixed_precision` through the
`ACCELERATE_MIXED_PRECISION` environment variable) and raises on a contradiction.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Mapping

from ..validation import ConfigError

__all__ = [
    "PRECISIONS",
    "DeviceInfo",
    "PrecisionChoice",
    "detect_device",
    "effective_request",
    "resolve_precision",
    "apply_precision",
    "log_precision_choice",
]

logger = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
_LAUNCHER_VALUES = ("no", "bf16", "fp16")
_TRUE = ("1", "true", "yes", "on", "y", "t")


@dataclass(frozen=True)
class DeviceInfo:
    """What the training device can do, as far as precision is concerned.

    Args:
        kind: `"cuda"` (NVIDIA or ROCm), `"xpu"`, `"mps"` or `"cpu"`: where the run will train.
        name: human-readable device name, for the log line.
        count: number of visible devices of that kind (1 for CPU).
        compute_capability: `(major, minor)` for CUDA devices, else None.
        bf16_supported: native bf16 matmuls (CUDA sm >= 8.0; on CPU: AVX512-BF16 / AMX present).
        fp16_supported: fp16 autocast with loss scaling is available on this device kind.
        tf32_supported: TF32 tensor-core matmuls (CUDA sm >= 8.0).
        forced_cpu: an accelerator is present but the run was told to use the CPU
            (`use_cpu=True` or `accelerate launch --cpu`).

    Example:
        ```python
        >>> from hf_fasttrain.stability.precision import DeviceInfo, resolve_precision
        >>> v100 = DeviceInfo(kind="cuda", name="Tesla V100", compute_capability=(7, 0),
        ...                   bf16_supported=False, fp16_supported=True)
        >>> resolve_precision("auto", v100).precision
        'fp16'
        ```
    """

    kind: str = "cpu"
    name: str = "cpu"
    count: int = 1
    compute_capability: tuple[int, int] | None = None
    bf16_supported: bool = False
    fp16_supported: bool = False
    tf32_supported: bool = False
    forced_cpu: bool = False

    def __post_init__(self):
        if self.kind not in ("cuda", "xpu", "mps", "cpu"):
            raise ValueError(f"DeviceInfo.kind must be one of cuda, xpu, mps, cpu; got {self.kind!r}")

    @property
    def is_cpu(self) -> bool:
        return self.kind == "cpu"

    def describe(self) -> str:
        text = self.name
        if self.compute_capability is not None:
            text += f" (sm {self.compute_capability[0]}.{self.compute_capability[1]})"
        if self.count > 1:
            text += f" x{self.count}"
        if self.forced_cpu:
            text += " (accelerator present, CPU forced)"
        return text


@dataclass(frozen=True)
class PrecisionChoice:
    """The resolved precision and the `TrainingArguments` values that realise it.

    Args:
        precision: `"bf16"`, `"fp16"` or `"fp32"`: what the run will train in.
        requested: what was asked for (`"auto"`, `"bf16"`, `"fp16"`, `"fp32"`).
        bf16, fp16: the `TrainingArguments` flags.
        use_cpu_needed: the Trainer needs `use_cpu=True` for this choice (bf16 on CPU).
        tf32: `True` / `False` to set `TrainingArguments.tf32`, None to leave torch's default.
        reason: one line saying what was chosen and why; logged at INFO.
        warning: set when the request could not be honoured as asked; logged at WARNING.

    Example:
        ```python
        >>> from hf_fasttrain.stability.precision import DeviceInfo, resolve_precision, apply_precision
        >>> choice = resolve_precision("bf16", DeviceInfo())  # bf16 on a plain CPU
        >>> apply_precision({"output_dir": "out"}, choice)
        {'output_dir': 'out', 'bf16': True, 'fp16': False, 'use_cpu': True}
        ```
    """

    precision: str
    requested: str
    bf16: bool
    fp16: bool
    use_cpu_needed: bool
    tf32: bool | None
    reason: str
    warning: str | None = None

    @property
    def mixed_precision(self) -> str:
        """The value Accelerate uses for this choice (`Accelerator(mixed_precision=...)`)."""
        return {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[self.precision]

    @property
    def autocast_dtype(self):
        """`torch.bfloat16` / `torch.float16`, or None for fp32 (no autocast)."""
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[self.precision]

    def training_kwargs(self) -> dict[str, Any]:
        """The `TrainingArguments` keyword arguments for this choice (only the ones it decides)."""
        kwargs: dict[str, Any] = {"bf16": self.bf16, "fp16": self.fp16}
        if self.use_cpu_needed:
            kwargs["use_cpu"] = True
        if self.tf32 is not None:
            kwargs["tf32"] = self.tf32
        return kwargs


def _check_request(value, field: str = "precision") -> str:
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ConfigError(field, value, f"allowed: {', '.join(PRECISIONS)}")
    return value


def effective_request(
    precision: str = "auto",
    *,
    bf16: bool = False,
    fp16: bool = False,
    launcher_mixed_precision: str | None = None,
) -> tuple[str, str]:
    """Merge the ways of asking for a precision into one request; raise on contradictions.

    Args:
        precision: the `precision` field (`auto`, `bf16`, `fp16`, `fp32`).
        bf16, fp16: the Trainer's own flags, as the user set them.
        launcher_mixed_precision: `ACCELERATE_MIXED_PRECISION` as `accelerate launch` sets it
            (`"no"`, `"bf16"`, `"fp16"`; None when not launched through accelerate). `"no"` is
            also what a config file without mixed precision gives, so it is not a request for fp32.

    Returns:
        `(request, source)`: the request for `resolve_precision` and where it came from, for the log.

    Example:
        ```python
        >>> effective_request("auto", fp16=True)
        ('fp16', 'fp16=True')
        >>> effective_request("bf16", launcher_mixed_precision="no")
        ('bf16', 'precision=bf16')
        ```
    """
    _check_request(precision)
    if bf16 and fp16:
        raise ConfigError("bf16", True, "set precision to one of bf16, fp16 instead",
                          problem="got True, and fp16=True too")
    launcher = launcher_mixed_precision.lower() if isinstance(launcher_mixed_precision, str) else None
    if launcher is not None and launcher not in _LAUNCHER_VALUES:
        raise ConfigError(
            "ACCELERATE_MIXED_PRECISION", launcher_mixed_precision, f"allowed: {', '.join(_LAUNCHER_VALUES)}",
            problem=f"got {launcher_mixed_precision!r}, not supported with the precision field",
        )
    asked = []  # (value, source) pairs besides the precision field itself
    if bf16 or fp16:
        flag = "bf16" if bf16 else "fp16"
        asked.append((flag, f"{flag}=True"))
    if launcher in ("bf16", "fp16"):
        asked.append((launcher, f"ACCELERATE_MIXED_PRECISION={launcher} (accelerate launch / config file)"))

    if precision != "auto":
        for value, source in asked:
            if value != precision:
                raise ConfigError(
                    "precision", precision, f"set one of them only (precision: {', '.join(PRECISIONS)})",
                    problem=f"got {precision!r}, which contradicts {source}",
                )
        return precision, f"precision={precision}"
    values = {value for value, _ in asked}
    if len(values) > 1:
        raise ConfigError(
            "precision", "auto", "set precision explicitly",
            problem="conflicting requests: " + " and ".join(source for _, source in asked),
        )
    if asked:
        return asked[0]
    return "auto", "precision=auto"


def resolve_precision(
    requested: str,
    device: DeviceInfo,
    *,
    tf32: bool | None = None,
    strict: bool = False,
) -> PrecisionChoice:
    """Resolve a precision request against a device. Pure: no torch calls, no logging.

    Args:
        requested: `"auto"`, `"bf16"`, `"fp16"` or `"fp32"`.
        device: from `detect_device()`, or built by hand in tests.
        tf32: None for auto (on where the GPU has TF32, unless `requested == "fp32"`), or an
            explicit True / False.
        strict: raise instead of falling back when the request cannot be honoured as asked
            (fp16 on CPU).

    Returns:
        A `PrecisionChoice`.

    Raises:
        ValueError: unknown `requested`; bf16 on a GPU without native bf16; fp16 on CPU with
            `strict`; fp16 on a device without it; `tf32=True` on a device without TF32.

    Example:
        ```python
        >>> h200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0),
        ...                   bf16_supported=True, fp16_supported=True, tf32_supported=True)
        >>> c = resolve_precision("auto", h200)
        >>> (c.precision, c.bf16, c.fp16, c.tf32)
        ('bf16', True, False, True)
        ```
    """
    _check_request(requested)
    if tf32 is not None and not isinstance(tf32, bool):
        raise ConfigError("tf32", tf32, "must be True, False or None (auto)")
    where = device.describe()
    warning = None
    use_cpu_needed = False

    if requested == "auto":
        if device.is_cpu:
            precision, why = "fp32", f"auto on CPU {where}: fp32 (CPU bf16 autocast is opt-in: precision=bf16)"
        elif device.kind == "mps":
            precision, why = "fp32", f"auto on {where}: fp32 (mixed precision on MPS is opt-in: precision=bf16/fp16)"
        elif device.bf16_supported:
            precision, why = "bf16", f"auto on {where}: bf16 (native bf16, no loss scaling needed)"
        elif device.fp16_supported:
            precision, why = "fp16", f"auto on {where}: fp16 with dynamic loss scaling (no native bf16)"
        else:
            precision, why = "fp32", f"auto on {where}: fp32 (no bf16 or fp16 support found)"
    elif requested == "bf16":
        if device.is_cpu:
            precision = "bf16"
            use_cpu_needed = True
            speed = "native" if device.bf16_supported else "no native bf16 on this CPU: expect it slower than fp32"
            why = f"bf16 autocast on CPU {where} ({speed}); use_cpu=True set, the Trainer requires it for bf16 on CPU"
        elif not device.bf16_supported:
            raise ConfigError(
                "precision", "bf16", "allowed here: fp16, fp32, auto",
                problem=f"got 'bf16', but {where} has no native bf16 (needs compute capability >= 8.0 on CUDA)",
            )
        else:
            precision, why = "bf16", f"bf16 on {where} (as requested)"
    elif requested == "fp16":
        if device.is_cpu:
            message = (
                f"precision='fp16' on CPU {where}: the Trainer ignores fp16 on CPU and would silently train in fp32"
            )
            if strict:
                raise ConfigError("precision", "fp16", "allowed on CPU: bf16, fp32, auto",
                                  problem=f"got 'fp16', but {message.split(': ', 1)[1]}")
            precision = "fp32"
            warning = message + "; training in fp32 (use precision='bf16' for mixed precision on CPU)"
            why = f"fp16 requested on CPU {where}: fp32 instead"
        elif not device.fp16_supported:
            raise ConfigError("precision", "fp16", "allowed here: bf16, fp32, auto",
                              problem=f"got 'fp16', but {where} has no fp16 support")
        else:
            precision, why = "fp16", f"fp16 with dynamic loss scaling on {where} (as requested)"
    else:  # fp32
        precision, why = "fp32", f"fp32 on {where} (as requested)"

    if tf32 is True and not device.tf32_supported:
        raise ConfigError(
            "tf32", True, "allowed here: None (auto) or False",
            problem=f"got True, but {where} has no TF32 (needs an NVIDIA GPU with compute capability >= 8.0)",
        )
    if tf32 is None and device.tf32_supported and requested != "fp32":
        tf32 = True
        why += "; tf32 on for fp32 matmuls"

    return PrecisionChoice(
        precision=precision,
        requested=requested,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu_needed=use_cpu_needed,
        tf32=tf32,
        reason=why,
        warning=warning,
    )


def apply_precision(kwargs: Mapping[str, Any], choice: PrecisionChoice) -> dict[str, Any]:
    """Return a copy of `TrainingArguments` keyword arguments with the choice applied.

    `bf16` and `fp16` are always written (the choice owns them); `use_cpu` is only ever turned on;
    `tf32` is written when the choice decides it. Other keys pass through untouched.

    Example:
        ```python
        >>> choice = resolve_precision("fp32", DeviceInfo())
        >>> apply_precision({"bf16": True, "learning_rate": 3e-4}, choice)
        {'bf16': False, 'learning_rate': 0.0003, 'fp16': False}
        ```
    """
    out = dict(kwargs)
    out.update(choice.training_kwargs())
    return out


def log_precision_choice(choice: PrecisionChoice, log: logging.Logger | None = None) -> None:
    """Log the choice: the reason at INFO, the fallback warning (if any) at WARNING."""
    log = logger if log is None else log
    if choice.warning:
        log.warning(choice.warning)
    log.info("precision: %s", choice.reason)


def _env_flag(env: Mapping[str, str], name: str) -> bool:
    return str(env.get(name, "")).strip().lower() in _TRUE


def detect_device(use_cpu: bool = False, env: Mapping[str, str] | None = None) -> DeviceInfo:
    """Inspect the machine this process will train on.

    Reads `ACCELERATE_USE_CPU` (set by `accelerate launch --cpu`) and `LOCAL_RANK` (the GPU this rank
    uses) from `env` (default `os.environ`). Asks CUDA for properties only, without allocating on it.

    Example:
        ```python
        >>> detect_device(use_cpu=True).kind
        'cpu'
        ```
    """
    import torch

    env = os.environ if env is None else env
    forced = bool(use_cpu) or _env_flag(env, "ACCELERATE_USE_CPU")
    cuda = torch.cuda.is_available()
    xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    mps = hasattr(torch.backends, "mps") and torch.backends.mps.is_available()

    if forced or not (cuda or xpu or mps):
        return DeviceInfo(
            kind="cpu",
            name=f"cpu ({torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores)",
            count=1,
            bf16_supported=_cpu_has_native_bf16(),
            forced_cpu=forced and (cuda or xpu or mps),
        )
    if cuda:
        count = torch.cuda.device_count()
        index = int(env.get("LOCAL_RANK", 0) or 0) % max(count, 1)
        capability = tuple(torch.cuda.get_device_capability(index))
        rocm = getattr(torch.version, "hip", None) is not None
        if rocm:
            bf16 = bool(torch.cuda.is_bf16_supported(including_emulation=False))
        else:
            bf16 = capability >= (8, 0)
        return DeviceInfo(
            kind="cuda",
            name=torch.cuda.get_device_name(index),
            count=count,
            compute_capability=capability,
            bf16_supported=bf16,
            fp16_supported=True,
            tf32_supported=(not rocm) and capability >= (8, 0),
        )
    if xpu:
        return DeviceInfo(
            kind="xpu",
            name=torch.xpu.get_device_name(0),
            count=torch.xpu.device_count(),
            bf16_supported=bool(torch.xpu.is_bf16_supported()),
            fp16_supported=True,
        )
    macos14 = getattr(torch.backends.mps, "is_macos_or_newer", lambda *a: False)(14, 0)
    return DeviceInfo(kind="mps", name="Apple MPS", bf16_supported=bool(macos14), fp16_supported=True)


def _cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX on this CPU (oneDNN's own check); False when torch cannot tell."""
    import torch

    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False

