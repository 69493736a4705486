"""TRL's SFTTrainer (1.16) patches the model with a fused LM head that returns per-token log-probs, not logits.

The parts of this package that run inside it: the stability callbacks (they read the loss the training step
returns and the gradient norm, never the logits) and the next-token accuracy metric (`compute_metrics`,
`preprocess_logits_for_metrics`), the only reader of logits. SFTTrainer recomputes the logits for the metric
(an extra forward per evaluation batch); the metric then equals TRL's own `mean_token_accuracy`.
"""

import pytest
import torch

from conftest import make_tiny_gpt2

trl = pytest.importorskip("trl")


@pytest.mark.slow
def test_package_parts_under_sft_trainer_fused_lm_head(tmp_path, tiny_tokenizer, tiny_lm):
    from trl import SFTConfig, SFTTrainer

    from hf_fasttrain import DivergenceGuardCallback, StabilityTrainerMixin
    from hf_fasttrain.metrics import make_compute_metrics, preprocess_logits_for_metrics

    class GuardedSFT(StabilityTrainerMixin, SFTTrainer):
        pass

    model = make_tiny_gpt2(len(tiny_tokenizer))
    tiny_tokenizer.pad_token = tiny_tokenizer.pad_token or tiny_tokenizer.eos_token
    config = SFTConfig(str(tmp_path), max_steps=4, per_device_train_batch_size=4, per_device_eval_batch_size=8,
                       learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none", bf16=False,
                       use_cpu=True, disable_tqdm=True, seed=0, dataset_kwargs={"skip_prepare_dataset": True})
    guard = DivergenceGuardCallback()
    trainer = GuardedSFT(model=model, args=config, train_dataset=tiny_lm["train"].select(range(32)),
                         eval_dataset=tiny_lm["validation"].select(range(16)), processing_class=tiny_tokenizer,
                         compute_metrics=make_compute_metrics(), preprocess_logits_for_metrics=preprocess_logits_for_metrics,
                         callbacks=[guard])
    # the fused head is in place: a forward with fused_lm_head=True returns log-probs and no logits
    ids = torch.tensor(tiny_lm["validation"][:2]["input_ids"])
    fused = trainer.model(input_ids=ids, labels=ids, fused_lm_head=True)
    assert getattr(fused, "logits", None) is None and fused.log_probs.shape == (2, ids.shape[1] - 1)

    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    # the guard judged each step on the loss the fused head gave (the one SFTTrainer logs)
    assert guard.memory.loss_history == pytest.approx(losses, rel=1e-3)
    with pytest.warns(FutureWarning, match="recomputed with an extra forward pass"):
        metrics = trainer.evaluate()
    # the package's accuracy (from recomputed logits) equals TRL's (from the fused head's is_top1)
    assert metrics["eval_next_token_accuracy"] == pytest.approx(metrics["eval_mean_token_accuracy"], abs=1e-6)
    assert 0 < metrics["eval_next_token_accuracy"] < 1
