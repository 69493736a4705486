"""The curated top-level API: every public name resolves to the object of the module that defines it."""

import importlib

import pytest

import hf_fasttrain

EXPECTED = {
    "FastTrainer", "FastTrainingArguments", "ModelArguments", "DataArguments",
    "optimizer_cls_and_kwargs_for", "LRScheduleCallback", "apply_batch_sampler", "apply_seq_len_warmup",
    "GradientClippingCallback", "DivergenceGuardCallback", "DivergenceError", "StabilityTrainerMixin", "RunRecorderCallback",
    "WeightAveragingCallback", "GracefulStopCallback",
    "train_with_restarts", "RestartConfig", "RestartOrchestrator", "apply_mup", "mup_init_",
}


def test_top_level_names_are_the_curated_set():
    assert set(hf_fasttrain.__all__) == EXPECTED | {"__version__"}
    from hf_fasttrain._version import __version__

    assert hf_fasttrain.__version__ == __version__


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_name_resolves_to_its_defining_module(name):
    obj = getattr(hf_fasttrain, name)
    module = importlib.import_module(hf_fasttrain._LAZY[name], "hf_fasttrain")
    assert obj is getattr(module, name)
    assert name in dir(hf_fasttrain)


def test_unknown_and_dropped_names_raise():
    for name in ("make_scheduler", "create_optimizer", "run_restarts", "nope"):
        with pytest.raises(AttributeError, match=name):
            getattr(hf_fasttrain, name)


def test_optim_exports_the_public_set_only():
    import hf_fasttrain.optim as optim

    assert set(optim.__all__) == {"OPTIMIZERS", "create_optimizer", "optimizer_cls_and_kwargs_for", "build_adamw",
                                  "AdamW", "AdEMAMix", "Lion", "MuonWithAdamW", "SOAP", "sharding_support"}
    assert all(hasattr(optim, n) for n in optim.__all__)
