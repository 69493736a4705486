"""LoRA through the recipe: the `peft:` section and --lora_* flags, adapter-only outputs that peft loads,
the base's own tokenizer, the merged model, refusals before any work, and resume equal to a straight run."""

import json

import pytest
import torch

from conftest import TINY_BLOCK, TINY_FILES, make_tiny_gpt2, tiny_args

peft = pytest.importorskip("peft")

from hf_fasttrain import DataArguments, ModelArguments  # noqa: E402
from hf_fasttrain.validation import ConfigError  # noqa: E402
from hf_fasttrain.config.recipes import load_recipe, parse_config, resolved_config, validate_recipe  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny pretrained GPT-2 base with its own tokenizer, as save_pretrained writes them."""
    path = tmp_path_factory.mktemp("base")
    model = make_tiny_gpt2(len(tiny_tokenizer))
    model.config.eos_token_id = model.config.bos_token_id = tiny_tokenizer.eos_token_id
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


def lora_run(base_dir, out, callbacks=(), **kw):
    from hf_fasttrain.run.train import train

    model_args = ModelArguments(model_name_or_path=str(base_dir), lora_r=4, lora_alpha=8.0,
                                **{k: v for k, v in kw.items() if k.startswith("lora_")})
    data_args = DataArguments(block_size=TINY_BLOCK, max_corpus_files=TINY_FILES, max_eval_samples=32)
    settings = dict(max_steps=6, learning_rate=1e-2, eval_strategy="steps", eval_steps=3, save_strategy="steps",
                    save_steps=3, auto_resume=True)
    settings.update({k: v for k, v in kw.items() if not k.startswith("lora_")})
    return train(model_args, data_args, tiny_args(out, **settings), callbacks=list(callbacks))


def test_lora_tiny_recipe_validates_and_the_peft_section_round_trips():
    sections = validate_recipe(load_recipe("lora_tiny"))
    assert sections["model"]["lora_r"] == 8 and sections["model"]["lora_target_modules"] == "all-linear"
    model_args, data_args, training_args = parse_config(["--config", "lora_tiny", "--lora_r", "16"])
    assert model_args.lora_r == 16 and model_args.lora_alpha == 16.0  # the recipe's alpha, the flag's rank
    config = resolved_config(model_args, data_args, training_args)
    assert config["peft"]["lora_r"] == 16 and "lora_r" not in config["model"]
    again = validate_recipe(config)
    assert again["model"]["lora_r"] == 16 and again["model"]["model_name_or_path"] == "runs/gpt2_tiny"
    # a full-training config has no peft section
    full = resolved_config(*parse_config(["--config", "sft_tiny"]))
    assert "peft" not in full


@pytest.mark.parametrize("recipe, field, allowed", [
    ({"peft": {"lora_rank": 8}}, "lora_rank", "did you mean 'lora_r'"),
    ({"peft": {"n_layer": 2}}, "n_layer", "belongs in the model: section"),
    ({"peft": "lora"}, "peft", "peft: a str, not a mapping; a mapping of LoRA keys"),
])
def test_bad_peft_sections_are_one_line(recipe, field, allowed):
    with pytest.raises(ValueError) as err:
        validate_recipe(recipe)
    assert field in str(err.value) and allowed in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, field, allowed", [
    ({"lora_r": 8}, "lora_r", "set model_name_or_path"),
    ({"model_name_or_path": "b", "lora_r": 0}, "lora_r", "positive integer"),
    ({"model_name_or_path": "b", "lora_r": 8, "lora_dropout": 1.5}, "lora_dropout", "[0, 1)"),
    ({"model_name_or_path": "b", "lora_alpha": 16.0}, "lora_alpha", "set lora_r"),
    ({"model_name_or_path": "b", "lora_merge": True}, "lora_merge", "set lora_r"),
])
def test_lora_settings_are_checked(kwargs, field, allowed):
    with pytest.raises(ConfigError) as err:
        ModelArguments(**kwargs)
    assert err.value.field == field and allowed in str(err.value)


def test_qlora_on_cpu_is_refused_in_one_line_before_any_work(tmp_path, capsys):
    from hf_fasttrain.cli import run_recipe

    out = tmp_path / "q"
    code = run_recipe(["--config", "lora_tiny", "--model_name_or_path", str(tmp_path / "none"), "--output_dir", str(out),
                       "--lora_load_in_4bit", "true"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("error: lora_load_in_4bit: QLoRA") and "needs a CUDA GPU" in err[-1]
    assert not any((out).glob("*"))  # nothing written


@pytest.mark.slow
def test_a_lora_run_writes_an_adapter_peft_loads_with_the_base_tokenizer_and_a_merged_model(tmp_path, base_dir,
                                                                                            tiny_tokenizer):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "lora"
    metrics = lora_run(base_dir, out, lora_merge=True, divergence_guard=True, weight_averaging="ema", ema_decay=0.9)
    assert sorted(p.name for p in out.glob("adapter_*")) == ["adapter_config.json", "adapter_model.safetensors"]
    assert not (out / "model.safetensors").exists()
    # checkpoints hold the adapter (and the average of the adapter only)
    ckpt = out / "checkpoint-6"
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").exists()
    average = torch.load(ckpt / "weight_average.pt", weights_only=True)
    assert average["names"] and all(".lora_" in n for n in average["names"])
    # the base's own tokenizer, not a new one trained on the data
    assert AutoTokenizer.from_pretrained(out).get_vocab() == tiny_tokenizer.get_vocab()
    # PeftModel.from_pretrained(base, out) is the trained model; the merged folder equals it as a plain model
    loaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), str(out)).eval()
    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
    ids = torch.tensor([[1, 5, 9, 12, 3, 7]])
    with torch.no_grad():
        a, b, m = loaded(ids).logits, base(ids).logits, merged(ids).logits
    assert not torch.allclose(a, b, atol=1e-4)  # the adapter changed the model
    torch.testing.assert_close(m, a, atol=1e-5, rtol=1e-5)
    # its final loss is the one metrics.json records
    record = json.loads((out / "metrics.json").read_text())
    evals = [h["eval_loss"] for h in record["history"] if "eval_loss" in h]
    assert evals[-1] < evals[0] and metrics["eval_loss"] == pytest.approx(evals[-1])


def test_a_tokenizer_that_does_not_fit_the_base_is_refused(tmp_path, base_dir, tiny_raw):
    from hf_fasttrain.data import get_tokenizer

    big = get_tokenizer(vocab_size=600, corpus=tiny_raw)  # the corpus of max_corpus_files=TINY_FILES
    big.save_pretrained(tmp_path / "big")
    from hf_fasttrain.run.train import train

    model_args = ModelArguments(model_name_or_path=str(base_dir), lora_r=4)
    data_args = DataArguments(block_size=TINY_BLOCK, max_corpus_files=TINY_FILES, tokenizer=str(tmp_path / "big"))
    with pytest.raises(ConfigError) as err:
        train(model_args, data_args, tiny_args(tmp_path / "out"))
    assert err.value.field == "tokenizer" and "the base's own tokenizer" in str(err.value)
    assert not (tmp_path / "out" / "config.yaml").exists()


@pytest.mark.slow
def test_a_killed_lora_run_resumes_to_the_straight_run(tmp_path, base_dir):
    from transformers import TrainerCallback

    class Crash(TrainerCallback):  # dies at the start of step 4, after checkpoint-3 is complete
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("killed")

    lora_run(base_dir, tmp_path / "straight")
    with pytest.raises(RuntimeError, match="killed"):
        lora_run(base_dir, tmp_path / "resumed", callbacks=[Crash()])
    assert (tmp_path / "resumed" / "checkpoint-3" / "adapter_model.safetensors").is_file()
    lora_run(base_dir, tmp_path / "resumed")  # the same command again: resumes from checkpoint-3

    def losses(path):
        history = json.loads((path / "metrics.json").read_text())["history"]
        return {h["step"]: h["loss"] for h in history if "loss" in h}

    straight, resumed = losses(tmp_path / "straight"), losses(tmp_path / "resumed")
    assert set(straight) == {1, 2, 3, 4, 5, 6} and {4, 5, 6} <= set(resumed)
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-5, abs=1e-6), step


def test_dora_adds_trainable_magnitudes_that_muon_leaves_to_adamw():
    from hf_fasttrain.modeling import apply_lora
    from hf_fasttrain.optim import create_optimizer

    model = apply_lora(make_tiny_gpt2(64), ModelArguments(model_name_or_path="base", lora_r=4, lora_use_dora=True))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    magnitudes = [n for n in trainable if "lora_magnitude_vector" in n]
    assert magnitudes and all(".lora_" in n for n in trainable)  # the base stays frozen
    opt = create_optimizer("muon", model, lr=1e-2, weight_decay=0.0)
    routed = {n: g["use_muon"] for g in opt.param_groups for n in g["param_names"]}
    assert not any(routed[n] for n in magnitudes)  # 1-D: AdamW
    assert all(routed[n] for n in trainable if "lora_A" in n or "lora_B" in n)


def test_a_tied_base_stays_tied_when_the_head_trains_in_full(recwarn):
    # GPT-2 ties its head to its input embedding: `lora_modules_to_save: lm_head` trains that one matrix (one
    # copy, no peft warning), and the merged model is tied again, with the trained weights in it
    from hf_fasttrain.modeling import apply_lora, merge_lora

    model = make_tiny_gpt2(64)
    lora = apply_lora(model, ModelArguments(model_name_or_path="base", lora_r=4, lora_modules_to_save="lm_head"))
    assert not [w for w in recwarn.list if "tie" in str(w.message)]
    copies = [n for n, p in lora.named_parameters() if p.requires_grad and "modules_to_save" in n]
    assert copies == ["base_model.model.transformer.wte.modules_to_save.default.weight"]
    trained = dict(lora.named_parameters())[copies[0]]
    with torch.no_grad():
        trained.add_(0.5)
    merged = merge_lora(lora)
    assert merged.lm_head.weight is merged.transformer.wte.weight
    torch.testing.assert_close(merged.lm_head.weight, trained.detach())
    # an untied head (or no embedding in modules_to_save) is left as peft has it
    untied = make_tiny_gpt2(64)
    untied.config.tie_word_embeddings = False
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    lora = apply_lora(untied, ModelArguments(model_name_or_path="base", lora_r=4, lora_modules_to_save="lm_head"))
    assert [n for n, p in lora.named_parameters() if "modules_to_save" in n and p.requires_grad] == [
        "base_model.model.lm_head.modules_to_save.default.weight"]
