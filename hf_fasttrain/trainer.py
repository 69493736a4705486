"""FastTrainer: ``transformers.Trainer`` wired to hf_fasttrain's parts. No algorithms live here.

Example:
    >>> from hf_fasttrain import FastTrainer, FastTrainingArguments
    >>> args = FastTrainingArguments(output_dir="runs/x", max_steps=200, logging_steps=10)
    >>> # trainer = FastTrainer(model=model, args=args, train_dataset=ds, data_collator=collator)
    >>> # trainer.train()   # logs gain tokens_per_second, padding_fraction, train_seconds (+ mfu on GPU)

With a plain ``TrainingArguments`` (or a TRL config), or with ``run_record=False``, ``save_on_signal=False`` and
every other option at its default, FastTrainer is exactly ``transformers.Trainer``: same logs, checkpoints,
``output_dir`` and callbacks.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import MutableMapping
from typing import Any, Optional

import torch
from transformers import Trainer

from .config.args import fast_option
from .config.plan import PLAN_FILE, RunPlan
from ._files import atomic_write_text
from .config.budget import describe_budget, non_embedding_parameters
from .callbacks.averaging import AVERAGE_FILE, WeightAveragingCallback
from .callbacks.run_record import WALL_CLOCK_LOG_KEYS, RunRecorderCallback
from .callbacks.clipping import ClipStatsWindow
from .callbacks.data_position import (STREAM_POSITION_FILE, ResumedEpochCallback, StreamPositionCallback,
                                      load_stream_position, stream_dataloader)
from .callbacks.graceful_stop import GracefulStopCallback
from .callbacks.guard import stability_callbacks
from .callbacks.mixin import StabilityTrainerMixin
from .callbacks.stop_at_step import StopAtStepCallback, TokenBudgetStopCallback
from .stability.clipping import norm_clip_stats
from .data.streaming import StreamPosition, TokenStream
from .modeling import is_causal_lm
from .optim import detect_sharding
from .optim.groups import param_roles
from .optim.lr_logs import logged_learning_rate, lr_logs
from .stability.precision import logger as precision_logger
from .resume_identity import PLAN_CADENCES, ResumePlan, discard_previous_run, plan_resume, write_options
from .runinfo import run_facts, training_config, update_run_info, write_run_record
from .schedules import TokenProgress
from .transfer import apply_transfer, check_config_mup
from .throughput import (HOST_BATCH_KEY, CompileCounter, HostBatchCollator, HostCopy, ThroughputMeter, count_batch,
                         device_peak_flops, model_dims, throughput_logs)
from .data.from_args import DataPlan
from .wiring import SeqLenWiring, _row_length
from .console import say

__all__ = ["FastTrainer", "WALL_CLOCK_LOG_KEYS"]

logger = logging.getLogger(__name__)

# transformers >= 5.25 hands a resume's batches to skip to this Trainer hook (before, the loop skipped them itself)
RESUME_HOOK = hasattr(Trainer, "get_resumed_dataloader")

# WALL_CLOCK_LOG_KEYS (from the run record): the log keys FastTrainer adds with run_record on that measure
# wall-clock: the only ones (with the Trainer's own *_runtime and *_per_second) in which a resumed run's logs differ
# from a straight run's. They are in the logs, not in state.log_history (the run record keeps them per checkpoint).


def _collate_with_host_batch(loader) -> None:
    """Make a training DataLoader's batches carry their host tensors (``HostBatchCollator``), so they are counted
    before they reach the device. The DataLoader that collates is accelerate's ``base_dataloader`` (its
    ``skip_first_batches`` copies the collate_fn on a resume). Not under ``DataLoaderDispatcher``: there the
    main process collates every rank's rows and each rank keeps a slice after the move; those are counted on
    the device."""
    from accelerate.data_loader import DataLoaderDispatcher

    if isinstance(loader, DataLoaderDispatcher):
        return
    base = getattr(loader, "base_dataloader", loader)
    collate = getattr(base, "collate_fn", None)
    if callable(collate) and not isinstance(collate, HostBatchCollator):
        base.collate_fn = HostBatchCollator(collate)


class FastTrainer(StabilityTrainerMixin, Trainer):
    """A ``Trainer`` that adds hf_fasttrain's techniques according to ``FastTrainingArguments``.

    Any arguments work: a plain ``TrainingArguments`` or a subclass of it (TRL's ``SFTConfig``) reads every
    package option as its default (off; see :func:`hf_fasttrain.config.args.fast_option`), and ``FastTrainer(model)``
    without arguments gets the Trainer's default ``TrainingArguments``. Any model works: batches without
    ``input_ids`` (``pixel_values``, ``inputs_embeds``, regression features) are counted in samples or in
    their token dimension.

    With ``run_record`` on (the ``FastTrainingArguments`` default) it logs, with every training log:
    ``tokens_per_second`` (real tokens, all processes; ``samples_per_second`` for batches without
    tokens), ``padding_fraction`` (share of pad tokens in the batches it trained on since the last log),
    ``train_seconds`` (training wall-clock excluding evaluation and checkpointing), clip statistics and, on
    a GPU with a known peak, ``mfu``. Evaluation of a causal LM adds ``eval_perplexity``. Each run writes ``config.yaml``
    and ``run_info.json`` into ``output_dir`` at the start, and ``metrics.json`` and ``loss_curve.png`` at
    the end (:class:`~hf_fasttrain.callbacks.RunRecorderCallback`). With it off (and with plain
    ``TrainingArguments``) none of this happens: logs, checkpoints, ``output_dir`` and the callback list
    are the Trainer's.

    Stability: ``clip_mode`` picks norm (``max_grad_norm``), value, AGC or no clipping, and training
    logs gain ``clip_pre_norm``, ``clip_post_norm``, ``clip_pre_norm_max`` and ``clip_fraction``;
    ``divergence_guard`` adds a :class:`~hf_fasttrain.callbacks.guard.DivergenceGuardCallback`,
    which gets every loss from ``training_step`` (``guard_*`` counts in the logs).

    Args:
        *args:
            Passed to ``transformers.Trainer`` (``model``, ``args``, ``data_collator``, ``train_dataset``, ...).
            ``args`` is a ``FastTrainingArguments`` to use the techniques.
        run_config (`dict`, *optional*, defaults to `None`):
            Extra sections (e.g. ``{"model": {...}, "data": {...}}``) saved into ``config.yaml`` beside the
            training arguments (with ``run_record`` on).
        data_plan (`DataPlan`, *optional*, defaults to `None`):
            The run's rows, steps and tokens as the recipe worked them out
            (:class:`~hf_fasttrain.data.from_args.DataPlan`); without it they come from the training set.
            ``trainer.plan`` (:class:`~hf_fasttrain.config.plan.RunPlan`) holds them with every technique's spec.
        **kwargs:
            Passed to ``transformers.Trainer``.

    Example:
        ```python
        >>> from hf_fasttrain import FastTrainer, FastTrainingArguments
        >>> args = FastTrainingArguments(output_dir="runs/x", max_steps=1000, optimizer="muon",
        ...                              learning_rate=1.6e-2, lr_decay="cosine", min_lr_ratio=0.1,
        ...                              divergence_guard=True)
        >>> # trainer = FastTrainer(model=model, args=args, train_dataset=train, data_collator=collator)
        >>> # trainer.train()
        ```
    """

    def __init__(self, *args, run_config: Optional[dict[str, Any]] = None, data_plan: Optional[DataPlan] = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        # transformers names no loss for a class whose name ends in neither ForCausalLM nor another task
        # (GPT2LMHeadModel): it warns "loss_type=None ... unrecognized" and uses ForCausalLM's. Naming that same
        # loss keeps the computation and drops the warning.
        if getattr(self.model, "loss_type", "") is None and not hasattr(self.model, "_loss_function"):
            self.model.loss_type = "ForCausalLM"
        self.run_config = dict(run_config or {})
        self._data_plan = data_plan  # the recipe's (rows, steps, tokens), else worked out from the training set
        opt = self._option
        # the run's options as given (budget_aware's settings are the plan's, not the arguments'): what a checkpoint
        # records and a rerun is compared with (hf_fasttrain.resume_identity)
        self.run_options: dict[str, Any] = {**self.run_config, **training_config(self.args)}
        # the recipe's decision about output_dir (hf_fasttrain.run._resume.resume_plan), for its train() call to say
        self.resume_decision: Optional[ResumePlan] = None
        self._apply_transfer()  # muP's output multiplier on the head, before any forward
        # the run's plan: each technique's spec and the run's length, built once from the arguments (a token budget's
        # optimizer steps set as max_steps), then budget_aware's step; every part below takes its spec from it
        self.plan: RunPlan = self._make_plan()
        pad_id = getattr(self.processing_class, "pad_token_id", None)
        self.throughput = ThroughputMeter(pad_token_id=pad_id)
        self.run_record = bool(opt("run_record"))
        if self.run_record and self.recorder is None:  # a recorder the user passed in is used as is
            self.add_callback(RunRecorderCallback())
        stop_at = opt("restart_stop_at_step")
        if stop_at:  # a random-restart trial: stop (and checkpoint) early, schedule from max_steps
            self.add_callback(StopAtStepCallback(stop_at))
        self._last_log_seconds = 0.0
        self._device_nan_filter = False  # set by train(): the loss filter on the device (training_step)
        self._compile_counter: Optional[CompileCounter] = None  # set by train() with torch_compile
        self._dims: Optional[tuple[int, int, int]] = None
        self.token_progress: Optional[TokenProgress] = None  # set by create_scheduler (schedule_unit='tokens')
        schedule = self.plan.schedule
        if schedule is not None and schedule.unit == "tokens" and opt("stop_at_token_budget") and schedule.total_tokens:
            # the lr is at its floor past the budget: stop there instead of training on to max_steps
            self.add_callback(TokenBudgetStopCallback(
                schedule.total_tokens,
                lambda: self.token_progress.tokens_seen if self.token_progress is not None else None))
        # stability: guard and value/AGC clipping as callbacks; the mixin hands them the loss
        # and merges their stats into the logs; norm-mode stats come from _clip_grad_norm below
        for callback in stability_callbacks(self.args, guard=self.plan.guard):  # plain args: none
            self.add_callback(callback)
        self._norm_clip_window = ClipStatsWindow()
        choice = getattr(self.args, "precision_choice", None)  # set by FastTrainingArguments
        if choice is not None and self.is_world_process_zero():
            precision_logger.info("precision: %s", choice.reason)
        # streaming: the trained position of a TokenStream, saved in every checkpoint (None for other data)
        self.stream_position = StreamPosition(self.train_dataset) if isinstance(self.train_dataset, TokenStream) else None
        self._stream_at_position = False  # a resume restored the stream's position: nothing to skip
        if self.stream_position is not None:
            self.add_callback(StreamPositionCallback(self.stream_position))
        # sequence-length options (samplers, packing, warmup); None when all are off
        self.seqlen = SeqLenWiring.from_trainer(self)
        # weight averaging (EMA / LAWA): evaluated, checkpointed and finally saved as the model
        self.weight_averaging = (WeightAveragingCallback(spec=self.plan.averaging)
                                 if self.plan.averaging is not None else None)
        if self.weight_averaging is not None:
            self.add_callback(self.weight_averaging)
        # graceful stop (save_on_signal): SIGTERM / Ctrl-C / SIGUSR1 -> finish the step, save, stop, exit 143/130/138
        self.graceful_stop: Optional[GracefulStopCallback] = None
        if opt("save_on_signal"):
            self._replace_jit_checkpoint()
            self.graceful_stop = GracefulStopCallback(self, exit_process=False)
            self.add_callback(self.graceful_stop)

    def _apply_transfer(self) -> None:
        """``optimizer_kwargs`` with ``parameterization: mup``: the model side of muP (hf_fasttrain.transfer: the head's
        1/m output multiplier, the depth rule), idempotent. A model config's own ``mup`` setting is refused in one line
        when this trainer builds the optimizer (it would replace the groups that setting asks the Trainer for)."""
        if self._option("optimizer") is None or self.model is None:
            return
        check_config_mup(self.model)
        apply_transfer(self.model, self.args.optimizer_kwargs)

    def _row_tokens(self) -> Optional[int]:
        """Tokens per training row: the recipe's data plan's, a stream's, or the first row's of a map-style set
        (None for rows without a token column, or an iterable set that would have to be read for it)."""
        if self._data_plan is not None:
            return self._data_plan.row_length
        data = self.train_dataset
        if data is None:
            return None
        names = getattr(self.processing_class, "model_input_names", None) or ["input_ids"]
        if not (isinstance(getattr(data, "row_length", None), int) or hasattr(data, "__getitem__")
                or self._option("max_tokens") is not None or self._option("seq_len_warmup_min") is not None):
            return None  # an iterable set: its first row is read only for a budget or a sequence-length warmup
        try:
            return _row_length(data, names[0])
        except (KeyError, IndexError, TypeError, StopIteration):  # rows without input_ids
            return None

    def _make_plan(self) -> RunPlan:
        """The run's :class:`~hf_fasttrain.config.plan.RunPlan` for the arguments as they are now; with
        ``budget_aware``, the plan of the settings measured best for its length
        (:meth:`~hf_fasttrain.config.plan.RunPlan.with_budget`), logged in one line."""
        plan = RunPlan.from_args(self.args, data=self._data_plan, row_length=self._row_tokens(),
                                 streaming=self.stream_position is not None if hasattr(self, "stream_position")
                                 else isinstance(self.train_dataset, TokenStream))
        if self._option("budget_aware"):  # before anything reads the schedule or the optimizer's settings
            plan = plan.with_budget(self.args, lambda: non_embedding_parameters(self.model))
            logger.info(describe_budget(plan.budget))
        return plan

    @property
    def budget(self) -> Optional[dict[str, Any]]:
        """What ``budget_aware`` chose for this run (the plan's), or None when it is off."""
        return self.plan.budget

    def _hp_search_setup(self, trial):
        """The Trainer's (a trial's settings set on the arguments), then the plan of those arguments."""
        super()._hp_search_setup(trial)
        if self.hp_search_backend is not None and trial is not None:
            self.plan = self._make_plan()

    def _replace_jit_checkpoint(self) -> None:
        """The Trainer's own JIT checkpoint (``enable_jit_checkpoint``) is what GracefulStopCallback extends: drop
        it and put back the SIGTERM handler it installed, so that one handler decides."""
        from transformers.trainer_jit_checkpoint import JITCheckpointCallback

        jit = self.pop_callback(JITCheckpointCallback)
        manager = getattr(jit, "jit_manager", None)
        if manager is not None and manager._original_sigterm_handler is not None:
            import signal

            signal.signal(signal.SIGTERM, manager._original_sigterm_handler)

    def _option(self, name: str):
        """A package option of ``self.args`` (its default when the args are a plain TrainingArguments)."""
        return fast_option(self.args, name)

    @property
    def recorder(self) -> Optional[RunRecorderCallback]:
        """The run's ``RunRecorderCallback`` (looked up: the Trainer may re-create it on a resume), or None."""
        handler = getattr(self, "callback_handler", None)
        for callback in handler.callbacks if handler is not None else ():
            if isinstance(callback, RunRecorderCallback):
                return callback
        return None

    # -- hooks ---------------------------------------------------------------------------------
    def get_train_dataloader(self):
        if self.stream_position is not None:  # a stream: this rank's rows, not split again by accelerate
            loader = stream_dataloader(self, self.train_dataset)
        else:
            loader = self.seqlen.train_dataloader() if self.seqlen is not None else None
            loader = loader if loader is not None else super().get_train_dataloader()
        if self.run_record or (self.plan.schedule is not None and self.plan.schedule.unit == "tokens"):
            _collate_with_host_batch(loader)  # tokens counted on the host (see _count_tokens)
        return loader

    def get_resumed_dataloader(self, dataloader, num_batches: int):
        """transformers >= 5.25: the train dataloader of a resume, past the ``num_batches`` trained in its epoch.

        A stream restored at its checkpoint's position starts at the next untrained row: it is returned as it
        is. Anything else gets the Trainer's skip (accelerate's ``skip_first_batches``), which for this
        package's samplers re-iterates the epoch's plan of indices and reads no rows."""
        if self._stream_at_position:
            return dataloader
        return super().get_resumed_dataloader(dataloader, num_batches)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        if self.stream_position is not None and self.args.world_size > 1:
            batches = self._stream_batches_every_rank_has(epoch_iterator, num_batches)
            num_items = self._get_num_items_in_batch(batches, device)
        else:
            batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.stream_position is not None:  # the loop took these batches: their position is the trained one
            batches = [self.stream_position.take(b) for b in batches]
        if self.seqlen is not None and self.seqlen.cutter is not None:  # sequence-length warmup
            first = self.seqlen.cutter.position
            batches = self.seqlen.cut(batches)
            self._cut_host_batches(batches, first)
            num_items = self._get_num_items_in_batch(batches, device)
        return batches, num_items

    def _cut_host_batches(self, batches: list, first: int) -> None:
        """Cut each batch's host tensors (its ``HostBatch``) as sequence-length warmup cut the batch, batch
        ``first + i`` of the schedule: the tokens counted are those trained on (same cut, same values)."""
        cutter = self.seqlen.cutter
        for i, batch in enumerate(batches):
            host = batch.get(HOST_BATCH_KEY) if isinstance(batch, MutableMapping) else None
            if host is not None:
                host.tensors = cutter.warmup.apply(host.tensors, first + i, cutter.pad_token_id)

    def _stream_batches_every_rank_has(self, epoch_iterator, num_batches: int) -> list:
        """This step's micro-batches, as many as the rank with the fewest has: every rank ends its pass together.

        Each rank reads its own part of a stream, so their passes end at different rows. Left alone, the rank
        whose pass ended starts its next one (or skips a step) while the others still step: their collectives
        pair up wrongly. One all-reduce (min) per optimizer step keeps them in step; the other ranks' last rows
        of that pass are not trained (as ``drop_last`` would across ranks), and when any rank has none left,
        every rank ends the pass."""
        batches = []
        for _ in range(num_batches):
            try:
                batches.append(next(epoch_iterator))
            except StopIteration:
                break
        have = torch.tensor(len(batches), dtype=torch.int64, device=self.args.device)
        torch.distributed.all_reduce(have, op=torch.distributed.ReduceOp.MIN)
        common = int(have.item())
        if common < len(batches):
            logger.info("rank %d: another rank's stream pass ended; %d of this step's %d micro-batches not trained",
                        self.args.process_index, len(batches) - common, len(batches))
        if common == 0:
            self.control.should_epoch_stop = True  # every rank, together: the next pass starts on all of them
        return batches[:common]

    def training_step(self, model, inputs, num_items_in_batch=None):
        # the batch's host tensors (HostBatchCollator) leave the batch here, before the model sees it
        host = inputs.pop(HOST_BATCH_KEY, None) if isinstance(inputs, MutableMapping) else None
        if self.run_record or self.token_progress is not None:
            self._count_tokens(inputs, host)
        loss = super().training_step(model, inputs, num_items_in_batch)
        if self._device_nan_filter and getattr(self, "_tr_loss", None) is not None:
            # the Trainer's logging_nan_inf_filter, on the device: a NaN/inf loss adds the mean of the losses since
            # the last log instead (the same value); its own check reads the loss to the host twice a micro-batch
            fill = self._tr_loss / (1 + self.state.global_step - self._globalstep_last_logged)
            loss = torch.where(torch.isfinite(loss), loss, fill.to(loss.dtype))
        return loss

    def _count_tokens(self, inputs, host) -> None:
        """One token count per micro-batch: the throughput meter sums it until the next log, and the
        token-counted schedule adds it before ``scheduler.step()``.

        Counted from ``host`` (the batch's tensors while they were in host memory) when the batch carries them:
        plain ints, so neither user waits for the device. Else counted on the device and left there
        (``count_batch(lazy=True)``): the meter reads its sum once per log, the schedule through a
        ``HostCopy`` (a non-blocking copy that waits for itself only). With several processes the schedule
        counts on the device even with ``host``: every rank's schedule must follow the same number, the sum
        over ranks, and the processes agree on it through ``accelerator.reduce``, a device collective (NCCL
        reduces device tensors only; an int from the host would first need a blocking copy to the device, and a
        host-side sum a second, gloo, process group and a host collective per micro-batch). The meter's count
        is summed over ranks once per log, so it stays on the host there too.
        """
        pad = self.throughput.pad_token_id
        on_host = host is not None and (self.token_progress is None or self.args.world_size == 1)
        count = host.count(pad) if on_host else count_batch(inputs, pad, lazy=True)
        if self.run_record:
            self.throughput.add_count(count)
        if self.token_progress is not None:
            self.token_progress.add(self._tokens_all_processes(inputs, count))

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """With ``args.lr_decay`` set: warmup + decay to a floor from hf_fasttrain.schedules (a LambdaLR
        whose state_dict also holds the token count, so checkpoints restore it); else the Trainer's.
        With sequence-length warmup counted in tokens, the schedule spans the run's full-length steps and
        advances with the tokens trained on, reaching its end at the run's last step."""
        if self.plan.length.schedule_steps is not None:  # the run's length is the plan's
            num_training_steps = self.plan.length.schedule_steps  # (an epoch-based run's: the Trainer's count)
        spec = self.plan.schedule
        if spec is None:
            scheduler = super().create_scheduler(num_training_steps, optimizer)
            if self.seqlen is not None:
                self.seqlen.count_schedule_in_tokens(scheduler)
            return scheduler
        if self.lr_scheduler is not None:  # Trainer resets the one it made, so this one came from optimizers=
            raise ValueError(
                f"lr_decay={spec.decay!r} but a scheduler ({type(self.lr_scheduler).__name__}) was passed "
                f"through FastTrainer(optimizers=...); use one or the other"
            )
        self.token_progress = None
        if spec.unit == "tokens":
            total = spec.total_tokens
            if not total and self.seqlen is not None and self.seqlen.count_tokens:  # the run's tokens, short rows too
                total = self.seqlen.schedule_tokens()
            total = total or self._default_total_tokens(num_training_steps)
            self.token_progress = TokenProgress(total)
        self.lr_scheduler = spec.build(optimizer if optimizer is not None else self.optimizer, num_training_steps,
                                       self.token_progress)
        self._created_lr_scheduler = True  # as Trainer.create_scheduler: rebuilt on the next train()
        if self.seqlen is not None and self.token_progress is None:  # schedule_unit='tokens' counts already
            self.seqlen.count_schedule_in_tokens(self.lr_scheduler)
        return self.lr_scheduler

    def _clip_grad_norm(self, model):
        # The Trainer's clip (it runs when max_grad_norm > 0). Other clip modes skip it: the Trainer then
        # only measures the norm (and still unscales fp16 gradients) in _get_grad_norm.
        if self._option("clip_mode") != "norm":
            return None
        pre_norm = super()._clip_grad_norm(model)
        if pre_norm is not None and self.run_record:
            if hasattr(pre_norm, "full_tensor"):  # a DTensor under FSDP2
                pre_norm = pre_norm.full_tensor()
            self._norm_clip_window.add(norm_clip_stats(pre_norm, self.args.max_grad_norm))
        return pre_norm

    def _get_learning_rate(self) -> float:
        """The lr of the step just taken: with per-group lrs the ``matrix`` group's (hf_fasttrain.optim.lr_logs),
        each group's kept for the log as ``lr/<role>``; else the Trainer's (its first group's)."""
        lr = super()._get_learning_rate()
        groups = getattr(self.optimizer, "param_groups", None) or []
        if any(g.get("lr_group") is not None for g in groups) or len({float(g["lr"]) for g in groups}) > 1:
            if getattr(self, "_roles", None) is None:  # the names of this model's parameters, by role, once
                self._roles = param_roles(self.model)
            self._group_lrs = lr_logs(groups, self._roles)
            return logged_learning_rate(groups, self._roles)
        self._group_lrs = {}
        return lr

    def log(self, logs: dict[str, float], start_time: Optional[float] = None) -> None:
        if "learning_rate" in logs and getattr(self, "_group_lrs", None):  # a training log: each group's lr too
            logs.update(self._group_lrs)
        recorder = self.recorder if self.run_record else None
        if recorder is not None:
            if "loss" in logs:  # a training log: every process calls this together
                logs.update(self._throughput_logs(recorder))
                logs.update(self._norm_clip_window.pop())
            else:  # evaluation and end-of-training logs carry the clock too (it survives a resume)
                logs.setdefault("train_seconds", recorder.train_seconds())
            if self._compile_counter is not None:  # torch_compile: cold compiles so far (see throughput.CompileCounter)
                logs.update(self._compile_counter.stats())
        super().log(logs, start_time)

    def create_optimizer(self, model=None):
        """``args.optimizer`` set: its spec, built from the args once (hf_fasttrain.optim.spec); else the Trainer's
        ``optim``. Refuses (one line, before training) an optimizer that would not give its update under this run's
        sharding (e.g. Muon under DeepSpeed ZeRO); under FSDP2 the model is not sharded yet here."""
        if self.optimizer is not None:
            return super().create_optimizer(model)
        if self._option("optimizer") is None:  # the Trainer's optim, with budget_aware's weight decay and betas
            args, self.args = self.args, self.plan.arguments(self.args)
            try:
                return super().create_optimizer(model)
            finally:
                self.args = args
        self._apply_transfer()  # again, for a model made by model_init after __init__ (a no-op otherwise)
        self.plan = self.plan.with_optimizer_steps(self.args, self.state.max_steps)  # an epoch-based run's, now known
        spec = self.plan.optimizer
        opt_model = self.model if model is None else model
        sharding = detect_sharding(args=self.args, accelerator=self.accelerator, model=opt_model)
        self.optimizer = spec.build(opt_model, sharding=sharding)
        for note in spec.notes(device=self.args.device, max_steps=self.args.max_steps):
            logger.warning(note)
        return self.optimizer

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        if self.weight_averaging is not None:  # also for a user's call mid-training; on_evaluate swaps back
            self.weight_averaging.swap_in(self.model)
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix: str = "eval"):
        """The Trainer's loop; a causal LM's metrics gain ``<prefix>_perplexity`` here, before ``evaluate`` logs
        them, so the logs, ``state.log_history``, ``metrics.json`` and the returned metrics all carry it."""
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                         metric_key_prefix)
        loss = output.metrics.get(f"{metric_key_prefix}_loss")
        if loss is not None and self.run_record and is_causal_lm(self.model):  # a perplexity only for an LM's loss
            output.metrics[f"{metric_key_prefix}_perplexity"] = math.exp(min(loss, 50.0))
        return output

    def _auto_resumes(self) -> bool:
        """``auto_resume`` with the run record on: off in neutral mode (``run_record`` off), which is the Trainer."""
        return bool(self.run_record and self._option("auto_resume"))

    def _init_training_state(self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint,
                             trial):
        """The Trainer's, then (run record on) this run's cadences on a resumed state: the Trainer takes logging,
        eval and save steps from the checkpoint's trainer_state.json, so a rerun that changed them (an option
        a resume applies and records) would keep the old ones."""
        out = super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs,
                                           resume_from_checkpoint, trial)
        if resume_from_checkpoint is not None and self.run_record:
            self.state.compute_steps(self.args, max_steps)
        return out

    def _save_checkpoint(self, model, trial):
        filtering = self._device_nan_filter  # the checkpoint's training_args.bin holds the arguments as given
        if filtering:
            self.args.logging_nan_inf_filter = True
        try:
            super()._save_checkpoint(model, trial)
        finally:
            if filtering:
                self.args.logging_nan_inf_filter = False
        if self.run_record and self.is_world_process_zero():  # the checkpoint holds the run's options
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
            if os.path.isdir(folder):
                write_options(folder, self.run_options)
                atomic_write_text(os.path.join(folder, PLAN_FILE),
                                  json.dumps({"plan": self.plan.as_dict()}, indent=1, default=str))

    def checkpoint_extras(self) -> tuple[str, ...]:
        """Files this run's callbacks add to every checkpoint after the Trainer's (a checkpoint lacks them when a
        kill came in between): the weight average, a stream's position."""
        extras = (AVERAGE_FILE,) if self.weight_averaging is not None else ()
        if self.stream_position is not None:
            extras += (STREAM_POSITION_FILE.format(rank=self.args.process_index),)
        return extras

    def planned_steps(self) -> Optional[int]:
        """The optimizer steps this run takes, known before it starts (None for an epoch-based run): the plan's."""
        return self.plan.length.optimizer_steps

    def plan_resume(self) -> ResumePlan:
        """``auto_resume``: what :meth:`train` without ``resume_from_checkpoint`` does with ``output_dir``: resume
        its last complete checkpoint (options compared first: :func:`hf_fasttrain.resume_identity.plan_resume`),
        report a finished run, or start from scratch. ``overwrite_output_dir`` discards the old run first."""
        out = self.args.output_dir
        if self._option("overwrite_output_dir"):
            if self.is_world_process_zero():
                gone = discard_previous_run(out)
                if gone:
                    logger.info("overwrite_output_dir: deleted %s from %s", ", ".join(gone), out)
            self.accelerator.wait_for_everyone()
            return ResumePlan()
        return plan_resume(out, self.run_options, max_steps=self.args.max_steps, planned_steps=self.planned_steps,
                           required=self.checkpoint_extras(), stop_at_step=self._option("restart_stop_at_step"))

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        name = os.path.basename(os.path.normpath(self.args.output_dir)) or self.args.output_dir
        decision, self.resume_decision = self.resume_decision, None  # the recipe's, for this call only
        if resume_from_checkpoint is None and trial is None and self._auto_resumes():
            decision = self.plan_resume()  # refuses (one line) before any work when the options changed
            if decision.finished_at is not None:
                if self.is_world_process_zero():
                    say(f"{decision.describe(name)} (outputs left as they are). To train longer, raise max_steps; to "
                        f"start over, use a new output_dir or overwrite_output_dir")
                return self._finished_output(decision.checkpoint)
            resume_from_checkpoint = decision.checkpoint
        if decision is not None and decision.checkpoint and decision.checkpoint == resume_from_checkpoint:
            # a resume the run chose itself: its plan is compared with the checkpoint's; what changed of the run's
            # length is said with the options applied (the cadences are options already)
            applied = [c for c in self._check_plan(decision.checkpoint)
                       if c.name.rsplit(".", 1)[-1] not in PLAN_CADENCES]
            decision.applied = [*decision.applied, *applied]
        if resume_from_checkpoint and trial is None and self.run_record and self.is_world_process_zero():
            # one visible line, whatever the script's logging: where this run continues from
            said = decision is not None and decision.checkpoint == resume_from_checkpoint
            where = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else "its last checkpoint"
            say(decision.describe(name) if said else f"resuming {name} from {where}")
        if self.run_record and self.is_world_process_zero():
            config = {**self.run_config, **training_config(self.plan.arguments(self.args))}  # budget_aware's values
            block = (self.run_config.get("data") or {}).get("block_size")
            write_run_record(self.args.output_dir, config, run=run_facts(self.model, self.args, block))
        self._last_log_seconds = None
        resume_dir = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        # per-train() counters start empty: hyperparameter_search reuses this Trainer for every trial (its
        # callbacks reset in on_train_begin unless resuming; see HF_TRAINER_5X.md)
        self.throughput = ThroughputMeter(pad_token_id=self.throughput.pad_token_id)
        self._norm_clip_window = ClipStatsWindow()
        if self.weight_averaging is not None:
            self.weight_averaging.resume_dir = resume_dir
        recorder = self.recorder
        if recorder is not None:
            recorder.resume_dir = resume_dir
        # -- compiles: counted over this train() call, logged and written into run_info.json
        self._compile_counter = CompileCounter() if self.args.torch_compile else None
        # the loss filter on the device (training_step) in place of the Trainer's, which reads every loss to the host
        self._device_nan_filter = bool(self.run_record and self.args.logging_nan_inf_filter)
        if self._device_nan_filter:
            self.args.logging_nan_inf_filter = False
        try:
            if self.stream_position is None or not resume_from_checkpoint:
                output = super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)
            else:
                output = self._train_from_stream_position(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)
        finally:
            if self._device_nan_filter:  # the arguments as given
                self.args.logging_nan_inf_filter, self._device_nan_filter = True, False
            if self.graceful_stop is not None:  # an exception skipped on_train_end: the handlers go back here
                self.graceful_stop.jit_manager.restore()
        if self.graceful_stop is not None and self.graceful_stop.stopped:
            # a stopped run is not a finished one: the caller's final save and evaluation must not run
            raise self.graceful_stop.stop(self.is_world_process_zero())
        if self._compile_counter is not None and self.run_record and self.is_world_process_zero():
            update_run_info(self.args.output_dir, self._compile_counter.stats())
        return output

    def _check_plan(self, checkpoint: str) -> list:
        """Compare ``checkpoint``'s plan with this run's, field by field
        (:func:`hf_fasttrain.resume_identity.check_resumed_plan`): refused in one line, before training, where a
        technique's spec differs although the options agree (a ``budget_aware`` table, a default changed since it
        was written) or where the run's global batch, row length or sequence-length warmup differ (another number of
        processes); returns the changes applied (the cadences; the run's length where nothing is laid out over it)."""
        from .resume_identity import check_resumed_plan

        return check_resumed_plan(checkpoint, self.plan.as_dict(), self.run_options, self.args.output_dir)

    def _finished_output(self, checkpoint: str):
        """What ``train()`` returns for a run already complete at ``checkpoint``: its state, no training."""
        from transformers.trainer_callback import TrainerState
        from transformers.trainer_utils import TrainOutput

        self.state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
        losses = [h["train_loss"] for h in self.state.log_history if "train_loss" in h]
        return TrainOutput(self.state.global_step, losses[-1] if losses else float("nan"), {})

    def _train_from_stream_position(self, checkpoint, trial, ignore_keys_for_eval, **kwargs):
        """Resume a stream at the position its checkpoint saved: nothing before it is read again to skip it (O(1))."""
        if checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            checkpoint = get_last_checkpoint(self.args.output_dir)
        position = load_stream_position(checkpoint, self.args.process_index) if checkpoint else None
        if position is None:  # an older checkpoint: the Trainer re-reads the stream up to its step
            logger.warning("%s holds no stream position: the Trainer re-reads the stream up to its step", checkpoint)
            return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)
        self.train_dataset.load_state_dict(position)
        self.stream_position.restore(position)
        # transformers >= 5.25: the Trainer counts the trained batches and asks get_resumed_dataloader to skip
        # them (it returns the stream as it is); before, ignore_data_skip keeps the loop from reading them again
        hook = RESUME_HOOK and not self.args.ignore_data_skip
        skip, self.args.ignore_data_skip = self.args.ignore_data_skip, not hook
        self._stream_at_position = hook
        epochs = ResumedEpochCallback(counted_steps=hook)
        self.add_callback(epochs)
        try:
            return super().train(checkpoint, trial, ignore_keys_for_eval, **kwargs)
        finally:
            self.args.ignore_data_skip = skip
            self._stream_at_position = False
            self.remove_callback(epochs)

    # -- helpers -------------------------------------------------------------------------------
    def _tokens_all_processes(self, inputs, count):
        """Real (non-pad) tokens of this micro-batch (``count``) summed over processes: every rank's schedule
        agrees. An int when it was counted on the host (one process), else a ``HostCopy`` of the device sum."""
        if not count.total:
            keys = sorted(inputs) if isinstance(inputs, dict) else type(inputs).__name__
            raise ValueError(
                f"schedule_unit='tokens' counts tokens, but this training batch has none (no input_ids, per-token "
                f"labels, attention_mask or inputs_embeds; it holds {keys}); use schedule_unit='steps'"
            )
        real = count.real
        if self.args.world_size > 1:
            t = torch.as_tensor(real, dtype=torch.int64, device=self.args.device)
            real = self.accelerator.reduce(t, reduction="sum")
        return HostCopy(real) if isinstance(real, torch.Tensor) else real

    def _default_total_tokens(self, num_training_steps: int) -> int:
        """Token budget when schedule_total_tokens is not given: steps x global batch x row length (the plan's)."""
        row_len, global_batch = self.plan.length.row_length, self.plan.length.global_batch
        if row_len is None:
            raise ValueError(
                "schedule_unit='tokens' needs schedule_total_tokens: the train dataset has no indexable "
                "'input_ids' rows to derive it from"
            )
        total = num_training_steps * global_batch * row_len
        logger.info("schedule_total_tokens not set: using %d = %d steps x %d rows x %d tokens",
                    total, num_training_steps, global_batch, row_len)
        return total

    def _throughput_logs(self, recorder: RunRecorderCallback) -> dict[str, float]:
        stats = self.throughput.flush()
        real, total, samples = stats["real_tokens"], stats["total_tokens"], stats["samples"]
        if self.args.world_size > 1:  # sum over processes; all of them are in this call
            t = torch.tensor([real, total, samples], dtype=torch.float64, device=self.args.device)
            t = self.accelerator.reduce(t, reduction="sum")
            real, total, samples = (int(x) for x in t.tolist())
        now = recorder.train_seconds()
        if self._last_log_seconds is None:  # first log of this train() call (maybe a resume)
            self._last_log_seconds = recorder._offset
        seconds, self._last_log_seconds = now - self._last_log_seconds, now
        peak_tflops = self._option("mfu_peak_tflops")
        peak = peak_tflops * 1e12 if peak_tflops else device_peak_flops(self.args.device)
        if peak and total and self._dims is None:
            self._dims = model_dims(self.model)
        out = throughput_logs(real, total, samples, seconds, seq_len=stats["seq_len"], peak_flops=peak,
                              dims=self._dims, n_devices=self.args.world_size)
        out["train_seconds"] = now
        return out
