"""The data position in every checkpoint, and the Trainer glue for a `TokenStream`.

- `stream_dataloader(trainer, stream)`: the training DataLoader over a `TokenStream` (the Trainer's
  collator, workers and device placement), not split again by accelerate: the stream already gives each
  rank and worker its own documents.
- `StreamPositionCallback`: at every save, writes this rank's trained position into the checkpoint
  (``stream_position_rank<r>.json``); `load_stream_position` reads it back for a resume.
- `ResumedEpochCallback`: during a resume from that position, the logged and saved ``epoch`` continue the
  straight run's (the Trainer counts its epoch loop from 0 again).

FastTrainer uses both (see its ``get_train_dataloader``, ``get_batch_samples``, ``get_resumed_dataloader`` and
``train``): a resumed run restores the position, and the Trainer must not re-read and drop the batches trained
before (which, for a stream, means reading and tokenizing them all). With transformers >= 5.25 the Trainer asks
``Trainer.get_resumed_dataloader`` for the resumed dataloader, and FastTrainer's returns the stream, already at
its position, as it is; before 5.25 FastTrainer sets ``ignore_data_skip`` for that ``train()`` call instead.
"""

from __future__ import annotations

import json
import math
import os
from functools import partial
from typing import Optional

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..data.streaming import StreamCollator, StreamPosition, TokenStream

__all__ = ["STREAM_POSITION_FILE", "position_file", "stream_dataloader", "StreamPositionCallback",
           "ResumedEpochCallback", "load_stream_position"]

STREAM_POSITION_FILE = "stream_position_rank{rank}.json"


def position_file(checkpoint: str, rank: int) -> str:
    return os.path.join(checkpoint, STREAM_POSITION_FILE.format(rank=rank))


def stream_dataloader(trainer, stream: TokenStream, data_collator=None):
    """The Trainer's train DataLoader over ``stream``: this rank's rows only, on the Trainer's device."""
    from accelerate.data_loader import prepare_data_loader
    from torch.utils.data import DataLoader
    from transformers.trainer_utils import seed_worker

    args = trainer.args
    workers = args.dataloader_num_workers
    collator = trainer._get_collator_with_removed_columns(
        data_collator if data_collator is not None else trainer.data_collator, description="Training")
    params = {
        "batch_size": trainer._train_batch_size,
        "collate_fn": StreamCollator(collator),
        "num_workers": workers,
        "pin_memory": args.dataloader_pin_memory,
        "persistent_workers": False,  # each epoch (and a resume) starts the workers at their position
        "worker_init_fn": partial(seed_worker, num_workers=workers, rank=args.process_index),
    }
    if workers > 0:
        params["prefetch_factor"] = args.dataloader_prefetch_factor
        params["multiprocessing_context"] = args.dataloader_multiprocessing_context
    # one process's view: accelerate must neither dispatch nor shard what the stream already split
    return prepare_data_loader(DataLoader(stream, **params), device=args.device, num_processes=1, process_index=0,
                               put_on_device=True, dispatch_batches=False)


class StreamPositionCallback(TrainerCallback):
    """Saves the trained position of this rank's stream in every checkpoint.

    Example:
        >>> from hf_fasttrain.data.streaming import StreamPosition
        >>> # trainer.add_callback(StreamPositionCallback(StreamPosition(stream)))
    """

    def __init__(self, position: StreamPosition):
        self.position = position

    def on_save(self, args, state, control, **kwargs):
        data = self.position.state_dict()
        if data is None:
            return
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if not os.path.isdir(folder):  # a save that kept no checkpoint (save_strategy, a search trial)
            return
        path = position_file(folder, self.position.stream.rank)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f)
        os.replace(tmp, path)


class ResumedEpochCallback(TrainerCallback):
    """Makes ``state.epoch`` after a resume at a stream's position continue the straight run's.

    For a dataset without a length the Trainer sets ``state.epoch = pass + (micro_step + 1) / (max_steps x
    accumulation)``, its pass counted from 0 again after a resume. The straight run stood at the checkpoint's
    epoch E (pass k plus the fraction of it trained). With ``counted_steps=False`` (the Trainer skipped nothing,
    ``ignore_data_skip``) its micro-step counter restarts at 0 too, so E is added during the first pass. With
    ``counted_steps=True`` (transformers >= 5.25, whose loop counts the checkpoint's ``global_step`` into its first
    pass and hands the batches to skip to ``get_resumed_dataloader``) E - global_step / max_steps is added,
    which is 0 for a resume within the stream's first pass. Later passes add k.
    """

    def __init__(self, counted_steps: bool = False) -> None:
        self.counted_steps = counted_steps
        self.offset = 0.0
        self.later = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        epoch = float(state.epoch or 0.0)  # restored from the checkpoint's trainer_state.json
        counted = state.global_step / state.max_steps if self.counted_steps and state.max_steps else 0.0
        self.offset, self.later = epoch - counted, float(math.floor(epoch))

    def on_step_end(self, args, state, control, **kwargs):
        state.epoch += self.offset  # the Trainer set it afresh before this call: the shift does not pile up

    def on_epoch_end(self, args, state, control, **kwargs):
        self.offset = self.later  # later passes start at a whole epoch


def load_stream_position(checkpoint: str, rank: int) -> Optional[dict]:
    """The position a checkpoint saved for ``rank``, or None when it has none."""
    path = position_file(checkpoint, rank)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)
