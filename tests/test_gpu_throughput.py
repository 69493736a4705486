"""benchmarks/gpu_throughput.py: its pure parts, and its CPU tiny mode end to end."""

import json
import math
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


from benchmarks import gpu_throughput as gt  # noqa: E402
from benchmarks._harness import throughput  # noqa: E402


def test_flops_per_token_gpt2_small():
    from hf_fasttrain.throughput import flops_per_token

    # N = 124,439,808 parameters - 786,432 position embeddings = 123,653,376
    n = 123_653_376
    assert flops_per_token(n, 12, 768, 1024) == 6 * n + 12 * 12 * 768 * 1024 == 855_166_464
    # the issue's figure: 152k tokens/s is 13% of an H200's 989 TFLOP/s
    assert 152_000 * flops_per_token(n, 12, 768, 1024) / gt.peak_bf16_flops("NVIDIA H200") == pytest.approx(0.1314, abs=1e-4)


def test_gpt2_small_parameter_count_matches():
    """The MFU's N is the real model's count (built on the meta device: no memory)."""
    import torch

    spec = gt.MODEL_SPECS["small"]
    with torch.device("meta"):
        model = throughput.build_gpt2(spec)
    assert throughput.param_count_no_pos(model) == 123_653_376


@pytest.mark.parametrize(
    "name,tflops",
    [("NVIDIA H200", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 80GB HBM3", 989.0),
     ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A10G", 70.0), ("Tesla V100-SXM2-16GB", 125.0), ("cpu", None), (None, None)],
)
def test_peak_lookup(name, tflops):
    got = gt.peak_bf16_flops(name)
    assert (got / 1e12 if got else None) == (pytest.approx(tflops) if tflops else None)


def test_summarize_steps_exact():
    s = gt.summarize_steps([0.3, 0.1, 0.2, 0.1, 0.5], tokens_per_step=100)
    assert s == {
        "step_time_median_s": 0.2,
        "step_time_p10_s": 0.1,
        "step_time_p90_s": 0.5,
        "tokens_per_s": pytest.approx(500.0),
        "tokens_per_s_window": pytest.approx(500 / 1.2),
    }
    with pytest.raises(ValueError, match="step_times must not be empty"):
        gt.summarize_steps([], 100)


def test_unknown_arm_is_refused():
    with pytest.raises(SystemExit, match=r"--arms: unknown \['hf-fast'\]; known: hf-default"):
        gt.main(["--device", "cpu", "--tiny", "--arms", "hf-fast"])


@pytest.mark.bench
def test_cpu_tiny_run_writes_json_with_all_arms(tmp_path):
    # in two parts, as a GPU session short of time would run it: the second appends its arm
    first = gt.main(["--device", "cpu", "--tiny", "--out-dir", str(tmp_path), "--name", "t",
                     "--arms", "hf-default,hf-tuned,fasttrain,torch-loop"])
    assert list(first["arms"]) == ["hf-default", "hf-tuned", "fasttrain", "torch-loop"]
    results = gt.main(["--device", "cpu", "--tiny", "--out-dir", str(tmp_path), "--name", "t",
                       "--arms", "torch-loop-chunked-ce", "--append"])
    with open(tmp_path / "t.json") as f:
        on_disk = json.load(f)
    assert on_disk["arms"].keys() == results["arms"].keys()
    assert on_disk["complete"] is True
    assert on_disk["appended_to_earlier_arms"] == ["fasttrain", "hf-default", "hf-tuned", "torch-loop"]
    assert list(on_disk["arms"]) == ["hf-default", "hf-tuned", "fasttrain", "torch-loop", "torch-loop-chunked-ce"]
    assert on_disk["config"]["batch_size"] == 8 and on_disk["config"]["seq_len"] == 64
    assert on_disk["machine"]["versions"]["torch"]
    assert (tmp_path / "t.png").stat().st_size > 0 and (tmp_path / "t.md").exists()

    expected_ok = ["hf-default", "hf-tuned", "fasttrain", "torch-loop", "torch-loop-chunked-ce"]
    for arm in expected_ok:
        r = on_disk["arms"][arm]
        assert r["status"] == "ok", (arm, r)
        run = r["repeats"][0]
        assert len(run["step_times_s"]) == 4 and all(t > 0 for t in run["step_times_s"])
        assert run["steps_run"] == 6  # 2 warm-up + 4 timed
        assert r["tokens_per_s"] == pytest.approx(8 * 64 / r["step_time_median_s"])
        assert r["tokens_per_s"] > 0 and r["peak_mem_bytes"] > 0
        assert r["mfu"] is None  # no peak FLOP/s known for a CPU
        # random tokens over a 512 vocabulary: the loss sits near ln(512) = 6.24 after a few steps
        assert abs(r["final_loss"] - math.log(512)) < 0.3
    settings = {a: on_disk["arms"][a]["settings"] for a in expected_ok}
    assert settings["hf-default"]["precision"] == "no"
    assert settings["hf-tuned"]["precision"] == "bf16"  # bf16 autocast on CPU via use_cpu
    assert settings["torch-loop-chunked-ce"]["loss"] == "chunked_lm_head_loss(chunk_size=4096)"
    assert settings["fasttrain"]["trainer"] == "FastTrainer"
    assert settings["fasttrain"]["recipe_settings"]["precision"] == "auto"
    assert settings["fasttrain"]["precision"] == "no"  # auto on CPU: fp32
    assert settings["fasttrain"]["optimizer"] == "muon"  # Muon + AdamW, from the recipe (benchmarks/scaling.py)
    assert all(s["torch_compile"] is False for s in settings.values())  # compile is off on CPU by default


def test_arm_settings_on_a_mocked_h200():
    """What each Trainer arm would ask of the Trainer on an H200 (no GPU needed to check it)."""
    from hf_fasttrain import FastTrainer, FastTrainingArguments
    from hf_fasttrain.stability.precision import DeviceInfo

    h200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0),
                      bf16_supported=True, fp16_supported=True, tf32_supported=True)
    base = {"output_dir": "o", "per_device_train_batch_size": 32, "use_cpu": False}
    cls, kw, attn, _ = gt.trainer_arm_setup("hf-default", base, h200, compile_on=True)
    assert (cls, kw, attn) == (None, base, None)
    cls, kw, attn, _ = gt.trainer_arm_setup("hf-bf16", base, h200, compile_on=True)
    assert kw == {**base, "bf16": True, "fp16": False} and attn is None
    cls, kw, attn, _ = gt.trainer_arm_setup("hf-tuned", base, h200, compile_on=True)
    assert kw == {**base, "bf16": True, "fp16": False, "tf32": True, "torch_compile": True,
                  "optim": "adamw_torch_fused"}
    assert attn == "sdpa"
    cls, kw, attn, settings = gt.trainer_arm_setup("fasttrain", base, h200, compile_on=True)
    assert cls is FastTrainer and kw.pop("_args_cls") is FastTrainingArguments
    want = {"precision": "auto", "torch_compile": True, "optimizer": "muon", "dataloader_num_workers": 4,
            "dataloader_pin_memory": True, "dataloader_persistent_workers": True, "auto_resume": False,
            "ddp_find_unused_parameters": False}
    assert {k: kw[k] for k in want} == want
    assert {k: kw[k] for k in base} == base  # the benchmark's run settings, not the recipe's
    assert "divergence_guard" in kw  # what runs every step comes along (the recipe's stability guard)
    assert not set(kw) & (set(gt.RUN_KEYS) - set(base))
    assert settings["recipe"] == "gpt2_small" and attn == "sdpa"
    with pytest.raises(ValueError, match="not a Trainer arm: torch-loop"):
        gt.trainer_arm_setup("torch-loop", base, h200, compile_on=True)


def test_fast_path_arms_change_one_part_of_the_recipe():
    """Each fasttrain-<part> arm is the recipe with exactly its own change; --arms fast-path names them all."""
    from hf_fasttrain.stability.precision import DeviceInfo

    h200 = DeviceInfo(kind="cuda", name="NVIDIA H200", compute_capability=(9, 0),
                      bf16_supported=True, fp16_supported=True, tf32_supported=True)
    base = {"output_dir": "o", "per_device_train_batch_size": 32, "use_cpu": False}
    _, recipe, _, _ = gt.trainer_arm_setup("fasttrain", base, h200, compile_on=True)
    assert recipe["divergence_guard"] is True and recipe.get("weight_averaging") in (None, "none")
    for arm, change in gt.FASTTRAIN_VARIANTS.items():
        _, kw, attn, settings = gt.trainer_arm_setup(arm, base, h200, compile_on=True)
        assert {k: v for k, v in kw.items() if recipe.get(k, "absent") != v} == change, arm
        assert settings["changed"] == change and attn == "sdpa"
    opts = gt._resolve_defaults(gt.make_parser().parse_args(["--device", "cpu", "--arms", "fast-path"]))
    assert opts.arm_list[:3] == ["fasttrain", "hf-tuned", "hf-default"]
    assert set(opts.arm_list) == {"hf-default", "hf-tuned", *gt.FASTTRAIN_VARIANTS}
