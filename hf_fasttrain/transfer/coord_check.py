"""The coordinate check: does a parameterization keep every layer's updates the same size at every width?

A model is built at a few widths (the same depth, the same head size: more heads), trained a few steps on one fixed
batch with the same settings, and two things are measured per layer at each step (the check that Yang et al. 2022,
"Tensor Programs V", arXiv:2203.03466, propose for testing a muP implementation):

- ``activation change``: the RMS of h_t - h_0, how far a layer's output on the batch has moved since
  initialisation (the embedding output, each block's output, the logits). muP makes it width-independent; under the
  standard parameterization with Adam the hidden layers' and the logits' grow with width.
- ``update``: the RMS of dW x, the change of a matrix layer's output that one step's weight change dW makes on that
  step's input x (the head's through its output multiplier). The spectral condition (Yang, Simon & Bernstein 2023,
  arXiv:2310.17813) asks for it to stay of the size of x at every width.

Each quantity's log-log slope against width (a least-squares line through log2 RMS over log2 width) says how it
scales: 0 is flat, 1 grows as the width. The check passes when every slope of both quantities is within the
tolerance (`DEFAULT_TOLERANCE`, 0.25: a quantity may change by at most 2^0.25 = 1.19x per doubling of the width).
A flat check shows the updates are the right size; that the best lr then carries over is a separate, measured claim.

Example:
    >>> result = coord_check(CoordCheckModel(n_layer=1, head_dim=8, vocab_size=32, n_positions=8), widths=(16, 32),
    ...                      steps=2, batch_size=2, seq_len=8)
    >>> sorted(result.slopes)[:2]
    ['activation change/block.0', 'activation change/embedding']
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from ..validation import ConfigError
from ..optim.groups import PARAMETERIZATIONS, output_multiplier, param_roles
from .mup import apply_transfer

__all__ = ["DEFAULT_TOLERANCE", "CoordCheckModel", "CoordCheckResult", "coord_check", "log_log_slope"]

DEFAULT_TOLERANCE = 0.25
QUANTITIES = ("activation change", "update")


def log_log_slope(widths: Sequence[float], values: Sequence[float]) -> float:
    """The least-squares slope of log2(value) against log2(width); NaN when a value is not a positive number.

    Example:
        >>> log_log_slope([64, 128, 256], [1.0, 2.0, 4.0]), log_log_slope([64, 128], [3.0, 3.0])
        (1.0, 0.0)
    """
    if len(widths) < 2 or any(not (isinstance(v, float) or isinstance(v, int)) or not v > 0 or not math.isfinite(v)
                              for v in values):
        return float("nan")
    xs = [math.log2(w) for w in widths]
    ys = [math.log2(v) for v in values]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


@dataclasses.dataclass(frozen=True)
class CoordCheckModel:
    """The model a coordinate check builds at each width: a decoder family with a fixed depth and head size.

    Args:
        model_type (`str`, defaults to `"gpt2"`): the family (`hf_fasttrain.modeling.decoder_config`'s).
        n_layer (`int`, defaults to 2): blocks, the same at every width.
        head_dim (`int`, defaults to 16): the head size, the same at every width (a width w has w / head_dim heads).
        vocab_size (`int`, defaults to 256): the vocabulary.
        n_positions (`int`, defaults to 64): the context length.
        kv_heads_ratio (`float`, defaults to 1.0): key/value heads per query head (grouped-query attention < 1).
        mlp_ratio (`float`, *optional*): the MLP's width over the model's, the same at every width; None: the family's
            default ratio (4, or 8/3 for a gated MLP) without its rounding (which would change the shape with width).
        model_config (`Mapping`, *optional*): any other attribute of the family's config (`tie_word_embeddings`).
    """

    model_type: str = "gpt2"
    n_layer: int = 2
    head_dim: int = 16
    vocab_size: int = 256
    n_positions: int = 64
    kv_heads_ratio: float = 1.0
    mlp_ratio: Optional[float] = None
    model_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for field in ("n_layer", "head_dim", "vocab_size", "n_positions"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(field, value, "an integer > 0")
        if not 0 < self.kv_heads_ratio <= 1:
            raise ConfigError("kv_heads_ratio", self.kv_heads_ratio, "a number in (0, 1]")

    def config(self, width: int):
        """The family's config at `width` (``width / head_dim`` heads)."""
        from ..config.decoders import GATED_MLP_FAMILIES, decoder_config

        if width % self.head_dim:
            raise ConfigError("widths", width, f"multiples of head_dim={self.head_dim} (heads of a fixed size)")
        heads = width // self.head_dim
        kv = max(1, round(heads * self.kv_heads_ratio))
        ratio = self.mlp_ratio or (8 / 3 if self.model_type in GATED_MLP_FAMILIES else 4.0)
        return decoder_config(
            self.model_type, vocab_size=self.vocab_size, num_hidden_layers=self.n_layer, num_attention_heads=heads,
            hidden_size=width, max_position_embeddings=self.n_positions,
            num_key_value_heads=None if self.kv_heads_ratio == 1 else kv,
            intermediate_size=int(round(ratio * width)),
            extra=self.model_config, bos_token_id=0, eos_token_id=0)

    def build(self, width: int) -> nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_config(self.config(width), attn_implementation="eager")


@dataclasses.dataclass
class CoordCheckResult:
    """What `coord_check` measured: per quantity and layer, the RMS at each width and step, and the slopes.

    ``values[quantity][layer][i]`` is the list over steps at ``widths[i]``; ``slopes["<quantity>/<layer>"]`` the
    log-log slope of the last step's value against width; ``flat`` whether every slope is within ``tolerance``.
    """

    widths: list[int]
    parameterization: str
    optimizer: str
    lr: float
    steps: int
    tolerance: float
    values: dict[str, dict[str, list[list[float]]]]
    activations: dict[str, list[list[float]]]
    losses: list[list[float]]
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def slopes(self) -> dict[str, float]:
        return {f"{q}/{layer}": log_log_slope(self.widths, [per_width[-1] for per_width in series])
                for q, layers in self.values.items() for layer, series in layers.items()}

    @property
    def worst(self) -> tuple[str, float]:
        """The quantity whose slope is farthest from 0 (NaN counts as farthest)."""
        return max(self.slopes.items(), key=lambda kv: math.inf if math.isnan(kv[1]) else abs(kv[1]))

    @property
    def flat(self) -> bool:
        return all(not math.isnan(s) and abs(s) <= self.tolerance for s in self.slopes.values())

    def table(self) -> str:
        """A Markdown table: each quantity's last-step RMS per width, its slope, and whether it is flat."""
        head = "| quantity | layer | " + " | ".join(f"w={w}" for w in self.widths) + " | slope | flat |"
        rows = [head, "|" + "---|" * (len(self.widths) + 4)]
        slopes = self.slopes
        for q, layers in self.values.items():
            for layer, series in layers.items():
                s = slopes[f"{q}/{layer}"]
                ok = not math.isnan(s) and abs(s) <= self.tolerance
                cells = " | ".join(f"{per_width[-1]:.3g}" for per_width in series)
                rows.append(f"| {q} | {layer} | {cells} | {s:+.2f} | {'yes' if ok else 'NO'} |")
        return "\n".join(rows)

    def summary(self) -> str:
        name, slope = self.worst
        verdict = "flat" if self.flat else "not flat"
        return (f"coord check ({self.parameterization}, {self.optimizer}, lr {self.lr:g}, {self.steps} steps, widths "
                f"{', '.join(map(str, self.widths))}): {verdict}; the largest |slope| is {abs(slope):.2f} ({name}), "
                f"tolerance {self.tolerance:g}")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "slopes": self.slopes, "flat": self.flat}

    def write(self, output_dir: str | Path) -> dict[str, Path]:
        """``coord_check.json``, ``coord_check.md`` (the table) and ``coord_check.png`` in `output_dir`."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "coord_check.json", "md": out / "coord_check.md", "png": out / "coord_check.png"}
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        paths["md"].write_text(f"{self.summary()}\n\n{self.table()}\n", encoding="utf-8")
        self.plot(paths["png"])
        return paths

    def plot(self, path: str | Path) -> None:
        """One panel per quantity: the last step's RMS against width, one line per layer, both axes log2."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(self.values), figsize=(6 * len(self.values), 4.2), squeeze=False)
        for ax, (q, layers) in zip(axes[0], self.values.items()):
            for layer, series in layers.items():
                ax.plot(self.widths, [s[-1] for s in series], marker="o", label=layer)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("width")
            ax.set_ylabel(f"RMS of the {q} (step {self.steps})")
            ax.set_title(q)
            ax.legend(fontsize=6, ncol=2)
        fig.suptitle(self.summary(), fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().float().pow(2).mean().sqrt())


def _first(output: Any) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return output[0]
    return getattr(output, "logits", None) if hasattr(output, "logits") else output[0]


def _blocks(model: nn.Module) -> list[nn.Module]:
    """The residual blocks: the longest ModuleList of the model."""
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return max(lists, key=len) if lists else []


def _matrix_modules(model: nn.Module) -> dict[str, nn.Module]:
    """name -> module of every linear layer whose weight is a hidden matrix, and the output head."""
    from ..optim.routing import conv1d_type

    roles = param_roles(model)
    head = model.get_output_embeddings()
    out = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, (nn.Linear, *conv1d_type())) or weight is None:
            continue
        if module is head:
            out["head"] = module
        elif roles.get(f"{name}.weight") == "matrix":
            out[name.split(".", 1)[1] if "." in name else name] = module
    return out


def _linear_delta(module: nn.Module, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """dW x for a layer's weight change `delta` on its input `x` (Conv1D stores (in, out), nn.Linear (out, in))."""
    if isinstance(module, nn.Linear):
        return x @ delta.t()
    return x @ delta


def _batch(model_spec: CoordCheckModel, data: str, batch_size: int, seq_len: int, seed: int) -> torch.Tensor:
    if data == "random":
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, model_spec.vocab_size, (batch_size, seq_len), generator=g)
    if data == "embedded":  # the package's default corpus: Python's standard library, its own BPE
        from ..data import build_stdlib_corpus, get_tokenizer, tokenize_and_chunk

        raw = build_stdlib_corpus(max_files=200)
        tokenizer = get_tokenizer(vocab_size=model_spec.vocab_size, corpus=raw)
        rows = tokenize_and_chunk(raw, tokenizer, block_size=seq_len)["train"]
        if len(rows) < batch_size:
            raise ConfigError("batch_size", batch_size, f"at most {len(rows)} rows of {seq_len} tokens here")
        return torch.tensor(rows.select(range(batch_size))["input_ids"])
    raise ConfigError("data", data, "one of random, embedded")


def _check(widths: Sequence[int], parameterization: str, steps: int, tolerance: float) -> None:
    if parameterization not in PARAMETERIZATIONS:
        raise ConfigError("parameterization", parameterization, f"one of {', '.join(PARAMETERIZATIONS)}")
    if len(widths) < 2 or any(isinstance(w, bool) or not isinstance(w, int) or w <= 0 for w in widths):
        raise ConfigError("widths", list(widths), "at least 2 integers > 0, e.g. 64,128,256,512")
    if sorted(set(widths)) != list(widths):
        raise ConfigError("widths", list(widths), "increasing and distinct")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("steps", steps, "an integer >= 1")
    if not (isinstance(tolerance, (int, float)) and tolerance > 0):
        raise ConfigError("tolerance", tolerance, "a number > 0")


def _one_width(model_spec: CoordCheckModel, width: int, batch: torch.Tensor, optimizer: str, lr: float,
               steps: int, transfer: dict[str, Any], optimizer_kwargs: Mapping[str, Any], seed: int):
    from ..optim import create_optimizer

    torch.manual_seed(seed)
    model = model_spec.build(width)
    apply_transfer(model, transfer, init=True)  # under mup: muP's init and the output multiplier
    model.train()
    opt = create_optimizer(optimizer, model, lr=lr, **{**optimizer_kwargs, **_active(transfer)})
    probes = {"embedding": model.get_input_embeddings()}
    probes.update({f"block.{i}": block for i, block in enumerate(_blocks(model))})
    probes["logits"] = model.get_output_embeddings()
    matrices = _matrix_modules(model)
    head_scale = 1.0 / (output_multiplier(model) or 1.0)
    seen: dict[str, torch.Tensor] = {}
    inputs: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda mod, a, out, name=name: seen.__setitem__(name, _first(out).detach()))
               for name, m in probes.items()]
    handles += [m.register_forward_hook(lambda mod, a, out, name=name: inputs.__setitem__(name, a[0].detach()))
                for name, m in matrices.items()]
    start: dict[str, torch.Tensor] = {}
    change = {name: [] for name in probes}
    update = {name: [] for name in matrices}
    raw = {name: [] for name in probes}
    losses = []
    try:
        for step in range(steps + 1):
            opt.zero_grad(set_to_none=True)
            loss = model(batch, labels=batch).loss
            if step == 0:
                start = dict(seen)
            else:
                for name in probes:
                    change[name].append(_rms(seen[name] - start[name]))
            for name in probes:
                raw[name].append(_rms(seen[name]))
            losses.append(float(loss.detach()))
            if step == steps:  # the last forward only measures where the last update took the layers
                break
            loss.backward()
            before = {name: m.weight.detach().clone() for name, m in matrices.items()}
            opt.step()
            with torch.no_grad():
                for name, m in matrices.items():
                    y = _linear_delta(m, inputs[name], m.weight.detach() - before[name])
                    update[name].append(_rms(y) * (head_scale if name == "head" else 1.0))
    finally:
        for h in handles:
            h.remove()
    return change, update, raw, losses


def _active(transfer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in transfer.items() if v is not None and not (k == "parameterization" and v == "standard")}


def coord_check(model: Optional[CoordCheckModel] = None, widths: Sequence[int] = (64, 128, 256, 512), *,
                parameterization: str = "mup", optimizer: str = "adamw", lr: float = 3e-3, steps: int = 3,
                base_width: Optional[int] = None, optimizer_kwargs: Optional[Mapping[str, Any]] = None,
                batch_size: int = 1, seq_len: int = 16, data: str = "random", seed: int = 0,
                tolerance: float = DEFAULT_TOLERANCE) -> CoordCheckResult:
    """Train `model` at each of `widths` for `steps` steps on one fixed batch and measure each layer's activation
    change and update RMS (see the module's docstring); `CoordCheckResult.flat` says whether all are width-flat.

    Args:
        model (`CoordCheckModel`, *optional*): the family, depth and head size (default: a 2-block GPT-2, heads of 16).
        widths (`Sequence[int]`): increasing widths, multiples of the head size (default 64, 128, 256, 512).
        parameterization (`str`): ``"mup"`` (default) or ``"standard"``.
        optimizer (`str`): any of `hf_fasttrain.optim.OPTIMIZERS` (default ``"adamw"``), at a constant `lr`.
        base_width (`int`, *optional*): muP's base width (default: the first width).
        optimizer_kwargs (`Mapping`, *optional*): the optimizer's other options (``weight_decay`` defaults to 0).
        batch_size, seq_len (`int`): the fixed batch; `data` ``"random"`` tokens (default) or ``"embedded"`` (rows of
            the package's default corpus, tokenized with its own BPE of `model.vocab_size`).
        seed (`int`): the same initialisation seed and batch at every width.
        tolerance (`float`): the largest |log-log slope| that counts as flat (default 0.25).
    """
    model = model or CoordCheckModel()
    widths = list(widths)
    _check(widths, parameterization, steps, tolerance)
    if seq_len > model.n_positions:
        raise ConfigError("seq_len", seq_len, f"at most the model's n_positions ({model.n_positions})")
    options = {"weight_decay": 0.0, **dict(optimizer_kwargs or {})}
    for key in ("parameterization", "base_width", "width", "lr"):
        if key in options:
            raise ConfigError(f"optimizer_kwargs.{key}", options[key], "give it as coord_check's own argument")
    transfer: dict[str, Any] = {"parameterization": parameterization}
    if parameterization == "mup":
        transfer["base_width"] = base_width or widths[0]
    for key in ("base_depth", "base_head_dim"):
        if key in options:
            transfer[key] = options.pop(key)
    for width in widths:  # every refusal before any model is built
        if width % model.head_dim:
            raise ConfigError("widths", width, f"multiples of head_dim={model.head_dim} (heads of a fixed size)")
    from ..optim.spec import OptimizerSpec

    OptimizerSpec.of(optimizer, lr=lr, **{**options, **_active(transfer)}).check_values()
    batch = _batch(model, data, batch_size, seq_len, seed)
    values: dict[str, dict[str, list[list[float]]]] = {q: {} for q in QUANTITIES}
    activations: dict[str, list[list[float]]] = {}
    losses = []
    for width in widths:
        change, update, raw, loss = _one_width(model, width, batch, optimizer, lr, steps, transfer, options, seed)
        for name, series in change.items():
            values["activation change"].setdefault(name, []).append(series)
        for name, series in update.items():
            values["update"].setdefault(name, []).append(series)
        for name, series in raw.items():
            activations.setdefault(name, []).append(series)
        losses.append(loss)
    settings = {"model": dataclasses.asdict(model), "optimizer_kwargs": options, **transfer, "batch_size": batch_size,
                "seq_len": seq_len, "data": data, "seed": seed}
    return CoordCheckResult(widths=widths, parameterization=parameterization, optimizer=optimizer, lr=lr, steps=steps,
                            tolerance=tolerance, values=values, activations=activations, losses=losses,
                            settings=settings)
