"""The configuration: ``FastTrainingArguments`` (the one object the Trainer sees), and
:func:`fast_option`, the one way the package reads its options from any Trainer's arguments. The model and
data sections of a recipe (``ModelArguments``, ``DataArguments``) live in :mod:`hf_fasttrain.config.model_data_args`
and are re-exported here.

Every field carries its ``--help`` text in ``metadata={"help": ...}``; the YAML recipe keys are exactly
these field names (training fields at the top level, ``model:`` and ``data:`` sections for the other
two dataclasses), and every one can be overridden on the command line as ``--<field> <value>``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Optional

from transformers import TrainingArguments

from ..validation import ConfigError, check_ranges
from ..validation import check as _check
from ..stability.clipping import CLIP_MODES
from ..data.from_args import check_seqlen_args
from ..stability.guard import GuardConfig, check_stability_sharding
from .model_data_args import DataArguments, ModelArguments
from ..restarts.config import restart_config_from_args

__all__ = ["ModelArguments", "DataArguments", "FastTrainingArguments", "ConfigError", "fast_option", "FastOptions",
           "SPEC_KINDS", "built_spec"]


@dataclass
class FastTrainingArguments(TrainingArguments):
    """``TrainingArguments`` plus the switches of hf_fasttrain's techniques.

    Everything the Trainer accepts still works; the fields below are grouped by technique (precision,
    run management, lr schedule, sequence length, stability, random restart, optimizer). With all of them
    at their defaults, ``FastTrainer`` behaves as ``transformers.Trainer``. Each field is also a recipe key
    and a ``--<field>`` flag; its help text is in the field's ``metadata``, and the docs' *All options*
    page lists every one with its default. Bad values raise a ``ValueError`` naming the field, the value
    and what is allowed, when the object is built (before any training).

    Args:
        precision (`str`, *optional*, defaults to `"auto"`):
            `"auto"`, `"bf16"`, `"fp16"` or `"fp32"`, resolved for the device the run lands on.
        lr_decay (`str`, *optional*, defaults to `None`):
            `"cosine"`, `"sqrt"`, `"linear"`, `"1-sqrt"` or `"constant"` after the warmup, down to `min_lr` /
            `min_lr_ratio`; `None` leaves the Trainer's `lr_scheduler_type` in charge.
        optimizer (`str`, *optional*, defaults to `None`):
            `"adamw"`, `"lion"`, `"ademamix"`, `"soap"` or `"muon"` instead of the Trainer's `optim`, with more
            options in `optimizer_kwargs` (`dict` or JSON `str`, defaults to `None`).
        clip_mode (`str`, *optional*, defaults to `"norm"`):
            `"norm"`, `"value"`, `"agc"` or `"none"`.
        divergence_guard (`bool`, *optional*, defaults to `False`):
            Skip NaN/inf steps and loss or gradient spikes, roll back when the weights went bad, stop a run
            that keeps diverging.

    The other fields: sequence length (``length_grouping``, ``max_tokens_per_batch``, ``packing``,
    ``curriculum_*``, ``seq_len_warmup_*``), random restart (``restart_*``), ``auto_resume``,
    ``mfu_peak_tflops``, and the lr schedule's floor and unit: see the *All options* page.

    Example:
        ```python
        >>> from hf_fasttrain import FastTrainingArguments
        >>> args = FastTrainingArguments(output_dir="runs/x", max_steps=100, learning_rate=1e-3,
        ...                              optimizer="lion", lr_decay="cosine", min_lr_ratio=0.1)
        >>> args.optimizer, args.lr_decay
        ('lion', 'cosine')
        ```
    """

    # --- Throughput logging ------------------------------------------------------------------
    mfu_peak_tflops: Optional[float] = field(
        default=None,
        metadata={"help": "Peak TFLOP/s of one device for the MFU estimate. Default: looked up from the "
                  "GPU name (dense bf16 datasheet figure); MFU is not logged on CPU or unknown devices."},
    )
    # --- Precision: mixed precision through Accelerate ------------------------------------------
    precision: str = field(
        default="auto",
        metadata={"help": "auto | bf16 | fp16 | fp32. auto: bf16 on GPUs with native bf16 (compute capability "
                  ">= 8.0), fp16 with loss scaling on older GPUs, fp32 on CPU. bf16 on CPU turns use_cpu on "
                  "(autocast); fp16 on CPU trains in fp32 with a warning. Sets bf16/fp16, which may also be "
                  "given but must agree. tf32 left unset means on where the GPU has it, unless precision=fp32."},
    )
    # --- Run management ----------------------------------------------------------------------
    auto_resume: bool = field(
        default=False,
        metadata={"help": "Resume from the last complete checkpoint in output_dir when one exists, after comparing the "
                  "options with the checkpoint's: logging, evaluation, save and loader options may change; any other "
                  "change is refused in one line. A finished run trains nothing. On by default in the recipe and "
                  "hf-fasttrain train (a stopped run continues when its command runs again); off by default in "
                  "FastTrainingArguments, where train() starts fresh as the Trainer does unless "
                  "resume_from_checkpoint is given. FastTrainer.train() does it with run_record on."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Discard the run already in output_dir: delete its checkpoints and end-of-run records, then "
                  "train from scratch. Without it, a rerun with auto_resume into an output_dir that holds a checkpoint resumes it, and "
                  "refuses (one line, before any work) when options that a resume may not change differ from the "
                  "checkpoint's (the table in docs: All options)."},
    )
    run_record: bool = field(
        default=True,
        metadata={"help": "Record the run. On: config.yaml and run_info.json in output_dir at the start, metrics.json "
                  "and loss_curve.png at the end (RunRecorderCallback, whose clock is saved with checkpoints); "
                  "training logs gain tokens_per_second (samples_per_second for batches without tokens), "
                  "padding_fraction, train_seconds, clip statistics and, on a GPU with a known peak, mfu; "
                  "a causal LM's evaluation gains eval_perplexity (exp of eval_loss; in the logs, log_history and "
                  "metrics.json). Off (with save_on_signal off): FastTrainer's logs, checkpoints, "
                  "output_dir and callback list are exactly the Trainer's. A plain TrainingArguments (no such field) "
                  "reads as off."},
    )
    save_on_signal: bool = field(
        default=True,
        metadata={"help": "On SIGTERM (preemption), the first Ctrl-C (SIGINT) or SIGUSR1: finish the optimizer step, save "
                  "checkpoint-<step> (complete: weights, optimizer, scheduler, RNG, data position and every "
                  "callback's state), print 'stopped at step N: ...', exit 143 / 130 / 138; every process stops at "
                  "the same step. A second Ctrl-C exits at once without saving. Extends the Trainer's "
                  "enable_jit_checkpoint (GracefulStopCallback). A plain TrainingArguments reads as off."},
    )
    # --- LR schedule (hf_fasttrain.schedules) -------------------------------------------------
    # Rule: lr_decay=None leaves the Trainer's lr_scheduler_type in charge; setting lr_decay replaces
    # it, so lr_scheduler_type must then stay at its default ('linear', unused) and lr_scheduler_kwargs
    # empty, else an error. The warmup length is TrainingArguments.warmup_steps in both cases.
    lr_decay: Optional[str] = field(
        default=None,
        metadata={"help": "Decay after the warmup, to the floor: 'cosine', 'sqrt', 'linear', '1-sqrt' (WSD "
                  "cooldown) or 'constant'. Default None (or 'none', to undo a recipe's choice on the command line): "
                  "the Trainer's lr_scheduler_type is used instead."},
    )
    budget_aware: bool = field(
        default=False,
        metadata={"help": "Use the schedule, weight decay and optimizer settings measured best for this run's length "
                  "in tokens per non-embedding parameter. It takes lr_decay, min_lr_ratio, decay_fraction, weight_decay, adam_beta2 and, with "
                  "optimizer muon, its AdamW part's betas, NorMuon, cautious weight decay and the AdamW part's lr ratio "
                  "(optimizer_kwargs betas, normuon_beta2, cautious_wd, adamw_lr_ratio) and, with optimizer adamw or muon, "
                  "the per-group lrs (optimizer_kwargs lr_multipliers, weight_decay_on) where a row measured them, from the settings "
                  "measured best for this run's length in tokens per non-embedding parameter (the table in hf_fasttrain.config.budget, "
                  "each row with the study and command it comes from); they replace the values given for those. The peak "
                  "learning_rate stays yours; where a row's settings were measured best at another peak lr, the log "
                  "says at what multiple."},
    )
    warmup_start_factor: float = field(
        default=0.0,
        metadata={"help": "With lr_decay: lr multiplier at step 0, rising linearly to 1 over warmup_steps."},
    )
    min_lr: Optional[float] = field(
        default=None,
        metadata={"help": "With lr_decay: absolute floor lr, the same in every param group (<= each group's "
                  "peak). At most one of min_lr / min_lr_ratio; neither means a floor of 0."},
    )
    min_lr_ratio: Optional[float] = field(
        default=None,
        metadata={"help": "With lr_decay: floor as a fraction of each param group's own peak lr, in [0, 1]."},
    )
    decay_fraction: Optional[float] = field(
        default=None,
        metadata={"help": "With lr_decay: hold the peak, then decay over only the last decay_fraction of "
                  "training (warmup-stable-decay). Default: 0.2 for '1-sqrt', all of the post-warmup span "
                  "for the other shapes."},
    )
    schedule_unit: str = field(
        default="steps",
        metadata={"help": "With lr_decay: progress counted in optimizer 'steps', or in 'tokens' trained on "
                  "(for runs whose tokens per step change, e.g. sequence-length warmup)."},
    )
    schedule_total_tokens: Optional[int] = field(
        default=None,
        metadata={"help": "With schedule_unit='tokens': tokens at which the schedule reaches its floor. "
                  "Default: max steps * global batch size * length of the first training row."},
    )
    stop_at_token_budget: bool = field(
        default=True,
        metadata={"help": "With schedule_unit='tokens': end the run (evaluating and saving as at max_steps) at "
                  "the first step by which schedule_total_tokens have been trained on, if that comes before "
                  "max_steps. false: train on to max_steps at the floor lr."},
    )
    # --- Sequence length: hf_fasttrain.data.samplers / seqlen / packing --------------------------
    # At most one batching option (length_grouping, max_tokens_per_batch, packing, curriculum_*);
    # seq_len_warmup_* is for fixed-length rows and combines with none of packing. All samplers are
    # deterministic per (data_seed or seed, epoch), sharded across ranks, and resume mid-epoch.
    length_grouping: bool = field(
        default=False,
        metadata={"help": "Batches of similar length (per_device_train_batch_size examples) in random order; "
                  "lengths read from length_column_name or computed once with a batched map."},
    )
    max_tokens_per_batch: Optional[int] = field(
        default=None,
        metadata={"help": "Token-budget batching: each micro-batch holds up to this many padded tokens "
                  "(examples x longest), instead of a fixed count. With packing='flatten': tokens per packed row."},
    )
    packing: str = field(
        default="none",
        metadata={"help": "Pack variable-length examples without padding and without attention across them: "
                  "'flatten' (one row of max_tokens_per_batch tokens per micro-batch), 'rows' "
                  "(per_device_train_batch_size rows of packing_row_length tokens) or 'none'."},
    )
    packing_row_length: Optional[int] = field(
        default=None, metadata={"help": "Tokens per packed row with packing='rows' (e.g. the model's context)."}
    )
    batch_warmup_min_tokens: Optional[int] = field(
        default=None,
        metadata={"help": "Batch-size warmup: tokens per micro-batch at the start, growing linearly to the full "
                  "micro-batch (max_tokens_per_batch, or per_device_train_batch_size rows) over "
                  "batch_warmup_fraction of max_steps; fewer tokens per step early, when the gradient noise "
                  "scale is small. Needs lr_decay, schedule_unit='tokens' and schedule_total_tokens: the steps are "
                  "smaller, and the run stops at the token budget or at max_steps, whichever comes first (give "
                  "max_steps room for the budget). null = off."},
    )
    batch_warmup_fraction: float = field(
        default=0.2, metadata={"help": "Share of max_steps over which the batch-size warmup grows (in [0, 1])."}
    )
    curriculum_min_length: Optional[int] = field(
        default=None,
        metadata={"help": "Short-to-long curriculum: only examples up to this length at the start; the limit "
                  "grows to curriculum_max_length over curriculum_fraction of max_steps. null = off."},
    )
    curriculum_max_length: Optional[int] = field(
        default=None, metadata={"help": "Curriculum's final length limit. Default: the longest example."}
    )
    curriculum_fraction: float = field(
        default=0.3, metadata={"help": "Share of max_steps over which the curriculum limit grows (then all lengths)."}
    )
    curriculum_pacing: str = field(
        default="linear", metadata={"help": "Growth of the curriculum limit: 'linear', 'sqrt' or 'steps'."}
    )
    curriculum_stages: int = field(default=4, metadata={"help": "Plateaus of the 'steps' curriculum pacing."})
    seq_len_warmup_min: Optional[int] = field(
        default=None,
        metadata={"help": "Sequence-length warmup (Li et al. 2022) for fixed-length rows: train on rows cut to "
                  "this length at first, growing to the full length over seq_len_warmup_fraction of the run. "
                  "null = off."},
    )
    seq_len_warmup_fraction: float = field(
        default=0.3, metadata={"help": "Share of the run (max_steps, or the full-length steps of max_tokens) over "
                                       "which the length grows (Composer's default 0.3)."}
    )
    seq_len_warmup_multiple: int = field(
        default=8, metadata={"help": "Lengths are multiples of this (8 for tensor cores; larger limits recompiles)."}
    )
    seq_len_warmup_pacing: str = field(
        default="linear", metadata={"help": "Growth of the length: 'linear', 'sqrt' or 'steps'."}
    )
    seq_len_warmup_stages: int = field(default=4, metadata={"help": "Plateaus of the 'steps' pacing."})
    seq_len_warmup_mode: str = field(
        default="truncate",
        metadata={"help": "'truncate' (drop each row's tail) or 'rechunk' (cut rows into more, shorter rows: no "
                  "token dropped)."},
    )
    seq_len_warmup_count_tokens: bool = field(
        default=True,
        metadata={"help": "With 'truncate': advance the LR schedule with the tokens seen, so short steps are not "
                  "charged as full ones; it reaches its floor at the run's last step. The run takes max_steps "
                  "optimizer steps; for a run of a given number of tokens, set max_tokens."},
    )
    max_tokens: Optional[int] = field(
        default=None,
        metadata={"help": "The run's length in tokens (all processes), for fixed-length rows, instead of max_steps: "
                  "the run takes the optimizer steps that hold these tokens (with sequence-length warmup, more than "
                  "full-length steps would: the start line says how many) and its schedules span them. A max_steps "
                  "given beside it must be that number. null: the run is max_steps optimizer steps."},
    )

    # --- Weight averaging: hf_fasttrain.stability.averaging + callbacks.averaging --------------------------
    weight_averaging: str = field(
        default="none",
        metadata={"help": "Evaluate and save an average of the weights instead of the last iterate: 'ema' "
                  "(exponential moving average, Composer's EMA), 'lawa' (mean of the last lawa_checkpoints "
                  "copies taken every lawa_interval steps; Sanyal et al. 2023) or 'none'. Checkpoints keep the "
                  "iterate as the model and the average in weight_average.pt; the final model is the average."},
    )
    ema_decay: float = field(
        default=0.99, metadata={"help": "weight_averaging='ema': decay per optimizer step, in (0, 1)."}
    )
    ema_warmup: bool = field(
        default=True,
        metadata={"help": "weight_averaging='ema': use min(ema_decay, (1+t)/(10+t)) at step t, so the random "
                  "init is forgotten early (tf.train.ExponentialMovingAverage's num_updates)."},
    )
    ema_update_every: int = field(
        default=1, metadata={"help": "weight_averaging='ema': update after every n-th step only (decay**n then)."}
    )
    lawa_checkpoints: int = field(
        default=5, metadata={"help": "weight_averaging='lawa': copies averaged (the window's length)."}
    )
    lawa_interval: int = field(
        default=10, metadata={"help": "weight_averaging='lawa': optimizer steps between copies."}
    )

    # --- Stability: gradient clipping and the divergence guard ---------------------------------
    clip_mode: str = field(
        default="norm",
        metadata={"help": "Gradient clipping, once per optimizer step after fp16 unscaling and DDP reduction: "
                  "'norm' (global L2 norm to max_grad_norm, the Trainer's own clipping), 'value' (every "
                  "element to [-clip_value, clip_value]), 'agc' (adaptive, per output unit: Brock et al. "
                  "2021) or 'none'. max_grad_norm applies in 'norm' mode only."},
    )
    clip_value: float = field(default=1.0, metadata={"help": "Bound for clip_mode='value'."})
    agc_lambda: float = field(
        default=0.01,
        metadata={"help": "clip_mode='agc': largest allowed ||grad|| / max(||weight||, 1e-3) per output unit "
                  "(Brock et al. 2021 use 0.01 at batch 4096, larger values for smaller batches). The output "
                  "layer and vectors are not clipped."},
    )
    divergence_guard: bool = field(
        default=False,
        metadata={"help": "Skip optimizer steps with a NaN/inf loss or gradient, a loss spike or a pre-clip gradient-norm "
                  "spike before they are applied; roll back to the last good state when a bad update reached the "
                  "weights (non-finite weights, or a loss that stays a spike for 8 steps); stop with a saved "
                  "checkpoint after more than guard_max_rollbacks rollbacks in 1000 steps (DivergenceGuardCallback). "
                  "Its statistics and counters survive a resume."},
    )
    guard_rollback: str = field(
        default="auto",
        metadata={"help": "Where the guard's last good state lives: 'memory' (a CPU copy every "
                  "guard_snapshot_every steps), 'checkpoint' (the Trainer's checkpoints), 'auto' (memory when "
                  "3x the parameter bytes fit in 4 GiB) or 'none' (spikes are skipped, never rolled back)."},
    )
    guard_snapshot_every: int = field(
        default=50, metadata={"help": "Optimizer steps between the guard's in-memory snapshots."}
    )
    guard_spike_sigma: float = field(
        default=6.0,
        metadata={"help": "A loss (or gradient norm) this many standard deviations above the mean of the last "
                  "guard_spike_window healthy steps is a spike (OLMo-core's rule)."},
    )
    guard_spike_window: int = field(
        default=128, metadata={"help": "Healthy steps the spike statistics are taken over (judged after half)."}
    )
    guard_max_rollbacks: int = field(
        default=3, metadata={"help": "Rollbacks allowed within 1000 steps; one more stops training."}
    )
    guard_grad_norm_ceiling: Optional[float] = field(
        default=1e4,
        metadata={"help": "The guard skips any step whose pre-clip gradient norm is above this, from the first step "
                  "on (the spike statistics need guard_spike_window // 2 steps first); null: no ceiling."},
    )

    # --- Random restart: hf_fasttrain/restarts ---------------------------------------------------
    # restart_num_seeds > 1 turns the recipe into a search: every seed trains for
    # restart_explore_fraction * max_steps (with the full run's LR schedule), the best continues.
    restart_num_seeds: int = field(
        default=1,
        metadata={"help": "Random restart: seeds to explore (model init and data order). 1 = a single run; "
                  "> 1 explores each seed briefly and continues the best to max_steps."},
    )
    restart_explore_fraction: float = field(
        default=0.1, metadata={"help": "Random restart: exploration budget as a fraction of max_steps, in (0, 1]."}
    )
    restart_rungs: int = field(
        default=1,
        metadata={"help": "Random restart: successive-halving rungs (1 = plain best-of-N). Rung r of R sits at "
                  "restart_explore_fraction * restart_keep_fraction**(R-1-r) of max_steps."},
    )
    restart_keep_fraction: float = field(
        default=0.5, metadata={"help": "Random restart: share of seeds kept at each rung before the last, in (0, 1)."}
    )
    restart_metric: str = field(
        default="eval_loss", metadata={"help": "Random restart: eval metric that ranks the seeds."}
    )
    restart_direction: str = field(
        default="min", metadata={"help": "Random restart: 'min' (lower is better) or 'max'."}
    )
    restart_divergence_threshold: Optional[float] = field(
        default=None,
        metadata={"help": "Random restart: a seed whose metric at a rung is worse than this is diverged "
                  "(non-finite values always are). E.g. ln(vocab size) for eval_loss."},
    )
    restart_replace_diverged: bool = field(
        default=False, metadata={"help": "Random restart: replace each diverged seed by a fresh one."}
    )
    restart_vary: str = field(
        default="both",
        metadata={"help": "Random restart: which seed changes across trials: 'both', 'model' (init) or 'data' "
                  "(order)."},
    )
    restart_parallel: str = field(
        default="no",
        metadata={"help": "Random restart: 'no' (trials one after another in this process) or 'per_gpu' (one "
                  "subprocess per visible GPU, CUDA_VISIBLE_DEVICES set per trial)."},
    )
    restart_backend: str = field(
        default="local",
        metadata={"help": "Random restart: where the trials run. 'local' (this machine, see restart_parallel) or "
                  "'ray' (each stage a Ray task on a cluster, pip install 'hf_fasttrain[ray]'); the search and "
                  "its state file stay in this process either way."},
    )
    restart_ray_address: Optional[str] = field(
        default=None,
        metadata={"help": "Random restart on Ray: the cluster, 'auto' (the one this machine joined), "
                  "'ray://host:port' or 'host:port'; null starts a local cluster on 127.0.0.1."},
    )
    restart_trial_resources: dict | str | None = field(
        default=None,
        metadata={"help": "Random restart on Ray: resources of one stage, a mapping (YAML) or JSON (CLI), e.g. "
                  "'{\"num_gpus\": 1, \"num_cpus\": 8}'; null: one CPU."},
    )
    restart_max_concurrent: Optional[int] = field(
        default=None,
        metadata={"help": "Random restart on Ray: most stages running at once; null: all of a rung (Ray queues "
                  "what its resources cannot place)."},
    )
    restart_stop_at_step: Optional[int] = field(
        default=None,
        metadata={"help": "Stop after this optimizer step, saving checkpoint-<step>, with the schedule still "
                  "built from max_steps. Set by the random-restart search on each trial."},
    )

    # --- Optimizer by name (hf_fasttrain.optim) ------------------------------------------------
    # Rule: `optimizer` set -> it replaces the Trainer's `optim`, which must then stay at its default
    # (and `optim_args` unset); learning_rate / weight_decay are its lr and weight decay.
    optimizer: Optional[str] = field(
        default=None,
        metadata={"help": "Optimizer from hf_fasttrain.optim: 'adamw', 'lion', 'ademamix', 'soap' or 'muon' "
                  "(Muon on hidden matrices + AdamW on embeddings, head, biases, norms). Replaces `optim`, which "
                  "must then be left at its default. learning_rate and weight_decay are its lr and weight decay "
                  "(adam_beta1/2 and adam_epsilon too for 'adamw'; they reach Muon's AdamW part, SOAP's Adam and "
                  "AdEMAMix's first two betas when set away from the Trainer's defaults 0.9, 0.999, 1e-8, else those "
                  "keep their own betas (0.9, 0.95), (0.95, 0.95) and (0.9, 0.999, 0.9999)); 'ademamix' warms alpha "
                  "and beta3 up over the whole run and warns when beta3's half-life is longer than the run. "
                  "Default: null, the Trainer's `optim`."},
    )
    optimizer_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "More options of `optimizer`, a mapping (YAML) or a JSON string (CLI). For example "
                  "'{\"betas\": [0.9, 0.99]}', '{\"muon_lr\": 0.02}', or for muon '{\"normuon_beta2\": 0.95}' (NorMuon), "
                  "'{\"cautious_wd\": true}' (cautious weight decay), '{\"adamw_lr_ratio\": 0.25}' (the AdamW part at a quarter "
                  "of Muon's lr), '{\"hyperball\": true}' (Hyperball: weight norms "
                  "held, no decay on Muon's matrices) and '{\"ns_dtype\": \"bfloat16\"}' (Newton-Schulz always in bf16; the "
                  "default, auto, runs it in fp32 where bf16 is not native, e.g. an AVX2 CPU); for every optimizer "
                  "'{\"lr_multipliers\": {\"embedding\": 16}, \"weight_decay_on\": \"matrices\"}' (per-group lrs: "
                  "embedding, head, norm, bias, matrix, router; weight decay on the hidden matrices only) and "
                  "'{\"parameterization\": \"mup\", \"base_width\": 64}' (muP: settings tuned at width 64 carry to "
                  "this model's width; also width, base_depth, base_head_dim; see the transfer card). Numbers written as "
                  "strings ('1e-5') are "
                  "converted; unknown keys and bad values are errors. Overrides learning_rate / weight_decay when "
                  "it sets lr / weight_decay."},
    )

    def __post_init__(self):
        # every numeric option's range, in one place (hf_fasttrain.validation), before anything else
        check_ranges({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init})
        restart_config_from_args(self)  # raises naming the restart_* field
        # stability: the names are the guard's; the numbers are in the range table
        _check(self.clip_mode in CLIP_MODES, "clip_mode", self.clip_mode, f"allowed: {', '.join(CLIP_MODES)}")
        built_spec(self, "guard")  # the guard's own checks (choices, relations), naming the guard_* field
        built_spec(self, "averaging")  # weight averaging: the names and ranges are the core's (stability.averaging)
        _check(isinstance(self.ema_warmup, bool), "ema_warmup", self.ema_warmup, "must be true or false")
        self._resolve_precision()  # before the Trainer's own checks (bf16 on CPU needs use_cpu)
        check_seqlen_args(self)
        from ..optim.options import check_optimizer_args  # torch's optimizers load only when arguments are built

        # the optimizer's name and options; its spec is the one the run's plan takes (built_spec)
        check_optimizer_args(self, spec=lambda args: built_spec(args, "optimizer", _known_steps(args)))
        check_stability_sharding(self)  # the guard and value/AGC clipping need whole gradients
        super().__post_init__()
        self._check_lr_schedule()

    def __getstate__(self):
        """The fields and the precision choice; the specs built from them (:func:`built_spec`) stay behind."""
        state = dict(self.__dict__)
        state.pop("_built_specs", None)
        return state

    def _check_lr_schedule(self) -> None:
        from transformers.trainer_utils import SchedulerType

        if isinstance(self.lr_decay, str) and self.lr_decay.lower() in ("none", "null", ""):
            self.lr_decay = None
        if self.lr_decay is None:
            for name, default in (("warmup_start_factor", 0.0), ("min_lr", None), ("min_lr_ratio", None),
                                  ("decay_fraction", None), ("schedule_unit", "steps"),
                                  ("schedule_total_tokens", None)):
                _check(getattr(self, name) == default, name, getattr(self, name),
                       f"only used with lr_decay; set lr_decay (e.g. 'cosine') or leave {name} at {default!r}")
            return
        _check(SchedulerType(self.lr_scheduler_type) == SchedulerType.LINEAR, "lr_scheduler_type",
               getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type),
               f"lr_decay={self.lr_decay!r} replaces the Trainer's scheduler; leave lr_scheduler_type at its "
               f"default 'linear' (then unused), or set lr_decay=None to use the Trainer's schedule")
        _check(not self.lr_scheduler_kwargs, "lr_scheduler_kwargs", self.lr_scheduler_kwargs,
               f"not used with lr_decay={self.lr_decay!r}; use min_lr / min_lr_ratio / decay_fraction")
        spec = built_spec(self, "schedule")  # the schedule's own checks, naming the option
        if self.min_lr is not None:
            _check(self.min_lr <= self.learning_rate, "min_lr", self.min_lr,
                   f"must be <= learning_rate={self.learning_rate} (the peak); or use min_lr_ratio")
        if self.max_steps > 0:  # the run length is known: check warmup and cooldown against it now
            spec.phases(self.max_steps)

    def _resolve_precision(self):
        """precision -> bf16 / fp16 / use_cpu / tf32 for this device (see hf_fasttrain.stability.precision)."""
        from ..stability.precision import detect_device, effective_request, resolve_precision
        from ..stability.precision import logger as precision_logger

        request, source = effective_request(
            self.precision, bf16=bool(self.bf16), fp16=bool(self.fp16),
            launcher_mixed_precision=os.environ.get("ACCELERATE_MIXED_PRECISION"),
        )
        device = detect_device(use_cpu=self.use_cpu)
        choice = resolve_precision(request, device, tf32=self.tf32)
        for key, value in choice.training_kwargs().items():
            setattr(self, key, value)
        if device.kind == "cpu":  # pinned memory serves copies to an accelerator; on CPU torch only warns about it
            self.dataloader_pin_memory = False
        # not a field (so not saved or parsed): FastTrainer logs its reason once logging is set up
        self.precision_choice = dataclasses.replace(choice, reason=f"{choice.reason} [from {source}]")
        if choice.warning:
            precision_logger.warning(choice.warning)


def _known_steps(args) -> Optional[int]:
    """The run's optimizer steps as the arguments give them (``max_steps``), or None (an epoch-based run)."""
    steps = getattr(args, "max_steps", -1)
    return steps if isinstance(steps, int) and steps > 0 else None


# the fields ScheduleSpec.from_args reads, in its order
_SCHEDULE_FIELDS = ("lr_decay", "warmup_steps", "warmup_start_factor", "min_lr", "min_lr_ratio", "decay_fraction",
                    "schedule_unit", "schedule_total_tokens")


def _spec_inputs(args, kind: str, steps: Optional[int]):
    """Everything the spec of ``kind`` is built from, as comparable values (two equal inputs give equal specs)."""
    if kind == "schedule":
        return tuple(getattr(args, name) for name in _SCHEDULE_FIELDS)
    if kind == "averaging":
        from ..stability.averaging import ARGS_FIELDS

        return tuple(getattr(args, name, None) for name in (*ARGS_FIELDS.values(), "ema_warmup"))
    if kind == "guard":
        from ..stability.guard import GUARD_ARGS_FIELDS

        return tuple(getattr(args, f"guard_{name}", None) for name in GUARD_ARGS_FIELDS)
    from ..optim.options import parse_optimizer_kwargs
    from ..optim.spec import run_kwargs

    name = args.optimizer
    return name, run_kwargs(name, args, steps), parse_optimizer_kwargs(name, args.optimizer_kwargs)


def _build_spec(args, kind: str, steps: Optional[int]):
    if kind == "schedule":
        from ..schedules import ScheduleSpec

        return ScheduleSpec.from_args(args)
    if kind == "averaging":
        from ..stability.averaging import AveragingSpec

        return AveragingSpec.from_args(args)
    if kind == "guard":
        return GuardConfig.from_training_args(args)
    from ..optim.spec import OptimizerSpec

    return OptimizerSpec.from_args(args, num_training_steps=steps)


SPEC_KINDS = ("optimizer", "schedule", "averaging", "guard")


def built_spec(args, kind: str, steps: Optional[int] = None):
    """The spec of technique ``kind`` (one of :data:`SPEC_KINDS`) for ``args``, built once: the arguments' own
    checks build it, the run's plan (:class:`~hf_fasttrain.config.plan.RunPlan`) takes that one. A spec is built
    again only from other inputs (a field set since, a token budget's optimizer steps). ``steps``: the run's
    optimizer steps (AdEMAMix's warmup spans them). Kept on a ``FastTrainingArguments`` object (``FastOptions``
    views share their arguments'), never saved with it; other arguments get a new spec each call."""
    owner = args._args if isinstance(args, FastOptions) else args
    if not isinstance(owner, FastTrainingArguments):  # a Trainer's own arguments: nothing checked them before
        return _build_spec(args, kind, steps)
    inputs = repr(_spec_inputs(args, kind, steps))  # repr: 1 and 1.0, True and 1 are other inputs
    memo = owner.__dict__.setdefault("_built_specs", [])
    for k, given, spec in memo:
        if k == kind and given == inputs:
            return spec
    spec = _build_spec(args, kind, steps)
    memo.append((kind, inputs, spec))
    return spec


# What an option reads as on arguments of another class (a plain TrainingArguments, TRL's configs): its default,
# except here. run_record and save_on_signal are off there, so FastTrainer given the Trainer's own arguments is the
# Trainer exactly.
_ABSENT_VALUES = {"run_record": False, "save_on_signal": False}


@functools.lru_cache(maxsize=None)
def _package_defaults() -> dict:
    """{option: (default, default_factory)} for the fields FastTrainingArguments adds to TrainingArguments."""
    trainer_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    out = {}
    for f in dataclasses.fields(FastTrainingArguments):
        if f.name in trainer_fields:
            continue
        factory = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        out[f.name] = (None if factory is not None else f.default, factory)
    return out


def fast_option(args, name: str):
    """The value of option ``name`` for ``args``, whatever their class.

    ``FastTrainingArguments`` (and its subclasses) give their field's value. Arguments of any other class
    (a plain ``TrainingArguments``, TRL's ``SFTConfig``, a user's subclass) give the option's default, which
    leaves the technique off, except ``run_record``, which reads as False there: FastTrainer is then the
    Trainer exactly. A field of the same name on another class is not read: it is not this option (TRL's
    ``SFTConfig.packing`` is a bool, ours a mode). A ``TrainingArguments`` field is read as is. The one way
    FastTrainer, its wiring and the callbacks read package options, so none of them needs the package's class.

    Example:
        >>> from transformers import TrainingArguments
        >>> args = TrainingArguments(output_dir="out", report_to="none")
        >>> fast_option(args, "lr_decay"), fast_option(args, "clip_mode"), fast_option(args, "run_record")
        (None, 'norm', False)
        >>> fast_option(args, "max_steps")  # a Trainer field is read as is
        -1
    """
    if isinstance(args, FastOptions):  # a view of arguments: read the arguments
        args = args._args
    defaults = _package_defaults()
    if name not in defaults:
        if not hasattr(args, name):
            raise ValueError(f"name={name!r} is not an option of FastTrainingArguments nor a field of "
                             f"{type(args).__name__}")
        return getattr(args, name)
    if isinstance(args, FastTrainingArguments):
        return getattr(args, name)
    if name in _ABSENT_VALUES:
        return _ABSENT_VALUES[name]
    default, factory = defaults[name]
    return factory() if factory is not None else default


class FastOptions:
    """``args`` seen through :func:`fast_option`: ``FastOptions(args).lr_decay == fast_option(args, "lr_decay")``.

    For code written against ``FastTrainingArguments`` attributes (the sequence-length wiring, the stability
    callbacks' factory) that must also take a plain ``TrainingArguments``.
    """

    def __init__(self, args):
        self._args = args

    def __getattr__(self, name):
        if name.startswith("_"):  # copy/pickle probes and private names: not options
            raise AttributeError(name)
        try:
            return fast_option(self._args, name)
        except ValueError:  # neither an option nor a field: hasattr() says False
            raise AttributeError(f"{type(self._args).__name__} has no option or field {name!r}") from None

