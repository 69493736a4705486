"""A plain `transformers.Trainer` script, switched to FastTrainer by its import line.

    python examples/switch_trainer.py            # offline, about a minute of CPU time

It trains a small GPT-2 from scratch on the embedded corpus (Python's own standard library, no network)
and prints the eval loss before and after. Delete the `hf_fasttrain` import and restore the
`transformers` one, and the same script runs the plain Trainer; the options after `# FastTrainer
options` are then the only lines to remove.
"""

from transformers import DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel

# from transformers import Trainer, TrainingArguments
from hf_fasttrain import FastTrainer as Trainer, FastTrainingArguments as TrainingArguments
from hf_fasttrain.data import get_tokenizer, load_text_datasets, tokenize_and_chunk


def main(output_dir: str = "runs/switch_trainer", max_steps: int = 60) -> dict:
    raw = load_text_datasets(max_files=40)  # or your own datasets.DatasetDict with a "text" column
    tokenizer = get_tokenizer(vocab_size=512, corpus=raw)
    rows = tokenize_and_chunk(raw, tokenizer, block_size=64)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                       # the tokenizer's special ids: GPT-2's default 50256 lies outside this vocabulary
                                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                       pad_token_id=tokenizer.pad_token_id))
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=16,
        learning_rate=1.6e-2,
        warmup_steps=0.1,
        weight_decay=0.1,
        logging_steps=20,
        report_to="none",
        # FastTrainer options
        optimizer="muon",           # Muon on the matrices, AdamW on the rest
        lr_decay="cosine",          # warmup, then cosine down to min_lr_ratio
        min_lr_ratio=0.1,
        divergence_guard=True,      # skip NaN steps and loss spikes, roll back bad weights
        weight_averaging="ema",     # evaluate and save an EMA of the weights
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=rows["train"],
        eval_dataset=rows["validation"].select(range(64)),
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        processing_class=tokenizer,
    )
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    print(f"eval loss {before:.3f} -> {after:.3f}; the run is in {output_dir}")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main()
