"""Precision choice for each device situation (mocked devices, no GPU), and the Accelerate configs."""

import contextlib
import doctest
import glob
import logging
import os
import re

import pytest

from hf_fasttrain.stability import precision as precision_mod
from hf_fasttrain.stability.precision import (
    DeviceInfo,
    apply_precision,
    detect_device,
    effective_request,
    log_precision_choice,
    resolve_precision,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CPU = DeviceInfo(kind="cpu", name="cpu", bf16_supported=False)
CPU_AMX = DeviceInfo(kind="cpu", name="cpu-amx", bf16_supported=True)
FORCED_CPU = DeviceInfo(kind="cpu", name="cpu", forced_cpu=True)
H200 = DeviceInfo(
    kind="cuda", name="NVIDIA H200", compute_capability=(9, 0),
    bf16_supported=True, fp16_supported=True, tf32_supported=True,
)
A100X8 = DeviceInfo(
    kind="cuda", name="NVIDIA A100", count=8, compute_capability=(8, 0),
    bf16_supported=True, fp16_supported=True, tf32_supported=True,
)
V100 = DeviceInfo(kind="cuda", name="Tesla V100", compute_capability=(7, 0), fp16_supported=True)
T4 = DeviceInfo(kind="cuda", name="Tesla T4", compute_capability=(7, 5), fp16_supported=True)
MPS = DeviceInfo(kind="mps", name="Apple MPS", bf16_supported=True, fp16_supported=True)
MI250 = DeviceInfo(kind="cuda", name="AMD MI250", compute_capability=(9, 0), bf16_supported=True, fp16_supported=True)


def exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly this one-line message."""
    return "^" + re.escape(message) + "$"


# (requested, device) -> (precision, bf16, fp16, use_cpu_needed, tf32, has_warning)
TABLE = [
    ("auto", CPU, ("fp32", False, False, False, None, False)),
    ("auto", CPU_AMX, ("fp32", False, False, False, None, False)),
    ("auto", FORCED_CPU, ("fp32", False, False, False, None, False)),
    ("auto", H200, ("bf16", True, False, False, True, False)),
    ("auto", A100X8, ("bf16", True, False, False, True, False)),
    ("auto", V100, ("fp16", False, True, False, None, False)),
    ("auto", T4, ("fp16", False, True, False, None, False)),
    ("auto", MPS, ("fp32", False, False, False, None, False)),
    ("auto", MI250, ("bf16", True, False, False, None, False)),
    ("bf16", CPU, ("bf16", True, False, True, None, False)),
    ("bf16", CPU_AMX, ("bf16", True, False, True, None, False)),
    ("bf16", FORCED_CPU, ("bf16", True, False, True, None, False)),
    ("bf16", H200, ("bf16", True, False, False, True, False)),
    ("bf16", MPS, ("bf16", True, False, False, None, False)),
    ("fp16", CPU, ("fp32", False, False, False, None, True)),
    ("fp16", H200, ("fp16", False, True, False, True, False)),
    ("fp16", V100, ("fp16", False, True, False, None, False)),
    ("fp16", MPS, ("fp16", False, True, False, None, False)),
    ("fp32", CPU, ("fp32", False, False, False, None, False)),
    ("fp32", H200, ("fp32", False, False, False, None, False)),
    ("fp32", V100, ("fp32", False, False, False, None, False)),
]


@pytest.mark.parametrize("requested,device,expected", TABLE, ids=[f"{r}-{d.name}" for r, d, _ in TABLE])
def test_resolve_table(requested, device, expected):
    c = resolve_precision(requested, device)
    got = (c.precision, c.bf16, c.fp16, c.use_cpu_needed, c.tf32, c.warning is not None)
    assert got == expected
    assert c.requested == requested
    assert device.name in c.reason


def test_mixed_precision_and_dtype_follow_choice():
    import torch

    assert resolve_precision("auto", H200).mixed_precision == "bf16"
    assert resolve_precision("auto", H200).autocast_dtype is torch.bfloat16
    assert resolve_precision("auto", V100).mixed_precision == "fp16"
    assert resolve_precision("auto", V100).autocast_dtype is torch.float16
    assert resolve_precision("auto", CPU).mixed_precision == "no"
    assert resolve_precision("auto", CPU).autocast_dtype is None


def test_bf16_on_cpu_sets_use_cpu_and_says_why():
    c = resolve_precision("bf16", CPU)
    assert c.training_kwargs() == {"bf16": True, "fp16": False, "use_cpu": True}
    assert "use_cpu=True" in c.reason
    assert "slower than fp32" in c.reason  # no native bf16 on this mocked CPU
    assert "slower" not in resolve_precision("bf16", CPU_AMX).reason


def test_fp16_on_cpu_falls_back_with_warning_or_raises_when_strict():
    c = resolve_precision("fp16", CPU)
    assert (c.precision, c.fp16) == ("fp32", False)
    assert "silently" in c.warning and "precision='bf16'" in c.warning
    with pytest.raises(ValueError, match=exact("precision: got 'fp16', but the Trainer ignores fp16 on CPU and would silently train in fp32; allowed on CPU: bf16, fp32, auto")):
        resolve_precision("fp16", CPU, strict=True)


def test_bf16_on_gpu_without_native_bf16_raises():
    with pytest.raises(ValueError, match=exact("precision: got 'bf16', but Tesla V100 (sm 7.0) has no native bf16 (needs compute capability >= 8.0 on CUDA); allowed here: fp16, fp32, auto")):
        resolve_precision("bf16", V100)
    with pytest.raises(ValueError, match="has no native bf16"):
        resolve_precision("bf16", DeviceInfo(kind="mps", name="old mac", fp16_supported=True))


@pytest.mark.parametrize("bad", ["bfloat16", "FP16", "mixed", "", None, 16])
def test_invalid_request_names_field_value_and_allowed(bad):
    with pytest.raises(ValueError, match=r"precision: got " + repr(bad).replace("(", r"\(").replace("[", r"\[") + "; allowed: auto, bf16, fp16, fp32"):
        resolve_precision(bad, H200)
    with pytest.raises(ValueError, match="; allowed: auto, bf16, fp16, fp32"):
        effective_request(bad)


def test_tf32_explicit_values():
    assert resolve_precision("fp32", H200, tf32=True).tf32 is True
    assert resolve_precision("bf16", H200, tf32=False).tf32 is False
    assert resolve_precision("auto", CPU, tf32=False).tf32 is False
    with pytest.raises(ValueError, match=exact('tf32: got True, but cpu has no TF32 (needs an NVIDIA GPU with compute capability >= 8.0); allowed here: None (auto) or False')):
        resolve_precision("auto", CPU, tf32=True)
    with pytest.raises(ValueError, match=exact('tf32: got True, but Tesla V100 (sm 7.0) has no TF32 (needs an NVIDIA GPU with compute capability >= 8.0); allowed here: None (auto) or False')):
        resolve_precision("fp16", V100, tf32=True)
    with pytest.raises(ValueError, match=exact("tf32: got 'yes'; must be True, False or None (auto)")):
        resolve_precision("auto", H200, tf32="yes")


def test_apply_precision_keeps_other_keys_and_only_turns_use_cpu_on():
    kwargs = {"output_dir": "o", "learning_rate": 3e-4, "bf16": True, "use_cpu": True, "tf32": None}
    out = apply_precision(kwargs, resolve_precision("fp32", CPU))
    assert out == {"output_dir": "o", "learning_rate": 3e-4, "bf16": False, "fp16": False, "use_cpu": True, "tf32": None}
    assert kwargs["bf16"] is True  # input untouched
    out = apply_precision({"output_dir": "o"}, resolve_precision("auto", H200))
    assert out == {"output_dir": "o", "bf16": True, "fp16": False, "tf32": True}


# (precision, bf16, fp16, launcher) -> (request, source)
REQUESTS = [
    (("auto", False, False, None), ("auto", "precision=auto")),
    (("auto", False, False, "no"), ("auto", "precision=auto")),
    (("auto", True, False, None), ("bf16", "bf16=True")),
    (("auto", False, True, "no"), ("fp16", "fp16=True")),
    (("auto", False, False, "BF16"), ("bf16", "ACCELERATE_MIXED_PRECISION=bf16 (accelerate launch / config file)")),
    (("auto", True, False, "bf16"), ("bf16", "bf16=True")),
    (("fp32", False, False, "no"), ("fp32", "precision=fp32")),
    (("bf16", True, False, "bf16"), ("bf16", "precision=bf16")),
    (("fp16", False, True, None), ("fp16", "precision=fp16")),
]


@pytest.mark.parametrize("given,expected", REQUESTS)
def test_effective_request(given, expected):
    p, bf16, fp16, launcher = given
    assert effective_request(p, bf16=bf16, fp16=fp16, launcher_mixed_precision=launcher) == expected


def test_effective_request_conflicts():
    with pytest.raises(ValueError, match=exact("precision: got 'fp32', which contradicts bf16=True; set one of them only (precision: auto, bf16, fp16, fp32)")):
        effective_request("fp32", bf16=True)
    with pytest.raises(ValueError, match=exact("precision: got 'bf16', which contradicts ACCELERATE_MIXED_PRECISION=fp16 (accelerate launch / config file); set one of them only (precision: auto, bf16, fp16, fp32)")):
        effective_request("bf16", launcher_mixed_precision="fp16")
    with pytest.raises(ValueError, match=exact('precision: conflicting requests: fp16=True and ACCELERATE_MIXED_PRECISION=bf16 (accelerate launch / config file); set precision explicitly')):
        effective_request("auto", fp16=True, launcher_mixed_precision="bf16")
    with pytest.raises(ValueError, match=exact('bf16: got True, and fp16=True too; set precision to one of bf16, fp16 instead')):
        effective_request("auto", bf16=True, fp16=True)
    with pytest.raises(ValueError, match=exact("ACCELERATE_MIXED_PRECISION: got 'fp8', not supported with the precision field; allowed: no, bf16, fp16")):
        effective_request("auto", launcher_mixed_precision="fp8")


def test_log_lines(caplog):
    log = logging.getLogger("test_precision")
    with caplog.at_level(logging.INFO, logger="test_precision"):
        log_precision_choice(resolve_precision("fp16", CPU), log)
        log_precision_choice(resolve_precision("auto", H200), log)
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        ("WARNING", "precision='fp16' on CPU cpu: the Trainer ignores fp16 on CPU and would silently train in fp32; "
                    "training in fp32 (use precision='bf16' for mixed precision on CPU)"),
        ("INFO", "precision: fp16 requested on CPU cpu: fp32 instead"),
        ("INFO", "precision: auto on NVIDIA H200 (sm 9.0): bf16 (native bf16, no loss scaling needed); "
                 "tf32 on for fp32 matmuls"),
    ]


def test_detect_device_cpu_here_and_forced_by_env():
    d = detect_device(env={})
    assert d.kind in ("cpu", "cuda", "xpu", "mps")
    forced = detect_device(env={"ACCELERATE_USE_CPU": "True"})
    assert forced.kind == "cpu" and forced.count == 1 and forced.tf32_supported is False
    assert forced.forced_cpu == (d.kind != "cpu")
    assert detect_device(use_cpu=True, env={}).kind == "cpu"


def test_detect_device_reads_cuda_properties(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    caps = {0: (7, 0), 1: (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: caps[i])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"gpu{i}")
    monkeypatch.setattr(torch.version, "hip", None)
    d1 = detect_device(env={"LOCAL_RANK": "1"})
    assert d1 == DeviceInfo(
        kind="cuda", name="gpu1", count=2, compute_capability=(9, 0),
        bf16_supported=True, fp16_supported=True, tf32_supported=True,
    )
    d0 = detect_device(env={})
    assert (d0.name, d0.bf16_supported, d0.tf32_supported) == ("gpu0", False, False)
    assert resolve_precision("auto", d0).precision == "fp16"
    assert detect_device(env={"ACCELERATE_USE_CPU": "1"}).forced_cpu is True


def test_device_info_rejects_unknown_kind():
    with pytest.raises(ValueError, match="DeviceInfo.kind must be one of cuda, xpu, mps, cpu; got 'tpu'"):
        DeviceInfo(kind="tpu")


def test_choice_matches_what_training_arguments_accept_on_cpu(tmp_path):
    """The kwargs a CPU choice produces construct TrainingArguments; the Trainer's own rule agrees."""
    from transformers import TrainingArguments

    kw = apply_precision({"output_dir": str(tmp_path), "report_to": "none"}, resolve_precision("bf16", CPU))
    args = TrainingArguments(**kw)
    assert (args.bf16, args.use_cpu, args.mixed_precision) == (True, True, "bf16")
    with pytest.raises(ValueError, match="use_cpu"):
        TrainingArguments(output_dir=str(tmp_path), report_to="none", bf16=True, use_cpu=False)


def test_docstring_examples_run():
    """Run the `Example:` blocks of the module's docstrings (HF-style ``` fences stripped)."""
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    globs = dict(vars(precision_mod))
    n = 0
    for name in precision_mod.__all__:
        obj = getattr(precision_mod, name)
        text = getattr(obj, "__doc__", None) or ""
        if ">>>" not in text or not callable(obj):
            continue
        text = "\n".join(line for line in text.splitlines() if line.strip() != "```" and not line.strip().startswith("```"))
        runner.run(parser.get_doctest(text, globs, name, None, 0))
        n += 1
    assert n == 6
    assert runner.failures == 0


# --- Accelerate config files -------------------------------------------------------------------

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "recipes", "accelerate", "*.yaml")))


def _launch_args(path, *extra):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", path, *extra, "train.py"])
    args, defaults, _ = _validate_launch_command(args)
    return args, defaults


def test_all_five_configs_present():
    names = [os.path.basename(p) for p in CONFIGS]
    assert names == ["deepspeed_zero2.yaml", "fsdp.yaml", "multi_gpu_ddp.yaml", "multi_node.yaml", "single_gpu.yaml"]


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_loads_with_known_keys_only(path):
    """ClusterConfig rejects unknown top-level keys; nested keys must be `accelerate launch` options."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    cfg = ClusterConfig.from_yaml_file(path)
    assert cfg.mixed_precision == "no"  # precision is the recipe's field, not the launcher's
    assert cfg.dynamo_config == {}  # compile is the recipe's torch_compile, not the launcher's
    dests = {a.dest for a in launch_command_parser()._actions}
    for key in cfg.fsdp_config:
        assert key in dests, f"{os.path.basename(path)}: fsdp_config key {key!r} is not an accelerate option"
    for key in cfg.deepspeed_config:
        assert key in dests, f"{os.path.basename(path)}: deepspeed_config key {key!r} is not an accelerate option"


# config -> (distributed flags, num_processes, num_machines)
EXPECTED_LAUNCH = {
    "single_gpu.yaml": (dict(multi_gpu=False, use_fsdp=False, use_deepspeed=False), 1, 1),
    "multi_gpu_ddp.yaml": (dict(multi_gpu=True, use_fsdp=False, use_deepspeed=False), 8, 1),
    "fsdp.yaml": (dict(multi_gpu=False, use_fsdp=True, use_deepspeed=False), 8, 1),
    "deepspeed_zero2.yaml": (dict(multi_gpu=False, use_fsdp=False, use_deepspeed=True), 8, 1),
    "multi_node.yaml": (dict(multi_gpu=True, use_fsdp=False, use_deepspeed=False), 16, 2),
}


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_resolves_like_accelerate_launch(path):
    flags, nproc, nmach = EXPECTED_LAUNCH[os.path.basename(path)]
    args, _ = _launch_args(path)
    assert {k: bool(getattr(args, k)) for k in flags} == flags
    assert (args.num_processes, args.num_machines, args.mixed_precision) == (nproc, nmach, "no")
    # command-line flags override the file, as the README shows
    args, _ = _launch_args(path, "--num_processes", "4")
    assert args.num_processes == 4


def test_fsdp_config_environment():
    from accelerate.utils.launch import prepare_multi_gpu_env

    args, _ = _launch_args(os.path.join(ROOT, "recipes", "accelerate", "fsdp.yaml"), "--main_process_port", "0")
    env = prepare_multi_gpu_env(args)
    got = {k: env[k] for k in ("ACCELERATE_USE_FSDP", "FSDP_VERSION", "FSDP_AUTO_WRAP_POLICY",
                               "FSDP_TRANSFORMER_CLS_TO_WRAP", "FSDP_RESHARD_AFTER_FORWARD", "FSDP_STATE_DICT_TYPE")}
    assert got == {
        "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
        "FSDP_TRANSFORMER_CLS_TO_WRAP": "GPT2Block", "FSDP_RESHARD_AFTER_FORWARD": "true",
        "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT",
    }
    assert args.nproc_per_node == "8"
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block  # the class named must exist

    assert GPT2Block.__name__ == env["FSDP_TRANSFORMER_CLS_TO_WRAP"]


def test_deepspeed_config_environment_leaves_batch_knobs_to_the_trainer():
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    args, defaults = _launch_args(os.path.join(ROOT, "recipes", "accelerate", "deepspeed_zero2.yaml"))
    args.deepspeed_fields_from_accelerate_config = list(defaults.deepspeed_config)
    _, env = prepare_deepspeed_cmd_env(args)
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_ZERO_STAGE"] == "2"
    assert env["ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE"] == "none"
    # not set -> DeepSpeedPlugin uses "auto" -> the Trainer fills them from the recipe
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in env
    assert "ACCELERATE_GRADIENT_CLIPPING" not in env


def test_multi_node_config_rendezvous():
    args, _ = _launch_args(os.path.join(ROOT, "recipes", "accelerate", "multi_node.yaml"), "--machine_rank", "1")
    assert (args.machine_rank, args.main_process_ip, args.main_process_port, args.rdzv_backend) == (1, "10.0.0.1", 29500, "static")


# --- FastTrainingArguments.precision -----------------------------------------------------------


class _ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@contextlib.contextmanager
def _capture(level):
    """Records of hf_fasttrain.stability.precision itself, whatever propagation run.setup_logging left behind."""
    log = logging.getLogger("hf_fasttrain.stability.precision")
    handler, old = _ListHandler(), log.level
    log.addHandler(handler)
    log.setLevel(level)
    try:
        yield handler.records
    finally:
        log.removeHandler(handler)
        log.setLevel(old)


def _fast_args(tmp_path, **kw):
    from hf_fasttrain import FastTrainingArguments

    return FastTrainingArguments(output_dir=str(tmp_path), report_to="none", **kw)


def test_field_bf16_on_cpu_turns_use_cpu_on(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(precision_mod, "detect_device", lambda use_cpu=False, env=None: CPU)
    args = _fast_args(tmp_path, precision="bf16", use_cpu=False)
    assert (args.bf16, args.fp16, args.use_cpu, args.mixed_precision) == (True, False, True, "bf16")
    assert args.precision_choice.reason.endswith("[from precision=bf16]")


def test_field_auto_on_cpu_is_fp32_and_fp16_falls_back_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(precision_mod, "detect_device", lambda use_cpu=False, env=None: CPU)
    args = _fast_args(tmp_path)
    assert (args.precision, args.bf16, args.fp16, args.mixed_precision) == ("auto", False, False, "no")
    with _capture(logging.WARNING) as records:
        args = _fast_args(tmp_path, precision="fp16")
    assert (args.fp16, args.mixed_precision) == (False, "no")
    assert [r.levelname for r in records] == ["WARNING"]
    assert "would silently train in fp32" in records[0].getMessage()


def test_field_reads_accelerate_launch_mixed_precision(tmp_path, monkeypatch):
    monkeypatch.setattr(precision_mod, "detect_device", lambda use_cpu=False, env=None: CPU)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    args = _fast_args(tmp_path)
    assert (args.bf16, args.use_cpu) == (True, True)
    assert "ACCELERATE_MIXED_PRECISION=bf16" in args.precision_choice.reason
    with pytest.raises(ValueError, match=exact("precision: got 'fp32', which contradicts ACCELERATE_MIXED_PRECISION=bf16 (accelerate launch / config file); set one of them only (precision: auto, bf16, fp16, fp32)")):
        _fast_args(tmp_path, precision="fp32")


def test_field_rejects_bad_values_before_training(tmp_path, monkeypatch):
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    with pytest.raises(ValueError, match="precision: got 'half'; allowed: auto, bf16, fp16, fp32"):
        _fast_args(tmp_path, precision="half")
    with pytest.raises(ValueError, match=exact("precision: got 'fp32', which contradicts bf16=True; set one of them only (precision: auto, bf16, fp16, fp32)")):
        _fast_args(tmp_path, precision="fp32", bf16=True)


def test_gpt2_small_recipe_uses_precision_auto(monkeypatch):
    from hf_fasttrain.config.recipes import load_recipe, validate_recipe

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    top = validate_recipe(load_recipe("gpt2_small"))[None]
    assert top["precision"] == "auto" and "bf16" not in top and "fp16" not in top
    assert (top["torch_compile"], top["optimizer"], top["dataloader_pin_memory"]) == (True, "muon", True)
    assert top["ddp_find_unused_parameters"] is False


def test_fast_trainer_logs_the_choice(tmp_path, monkeypatch):
    from conftest import make_tiny_gpt2

    from hf_fasttrain import FastTrainer

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(precision_mod, "detect_device", lambda use_cpu=False, env=None: CPU)
    args = _fast_args(tmp_path, precision="bf16")
    with _capture(logging.INFO) as records:
        FastTrainer(model=make_tiny_gpt2(64), args=args)
    lines = [r.getMessage() for r in records]
    assert lines == ["precision: bf16 autocast on CPU cpu (no native bf16 on this CPU: expect it slower than fp32); "
                     "use_cpu=True set, the Trainer requires it for bf16 on CPU [from precision=bf16]"]
