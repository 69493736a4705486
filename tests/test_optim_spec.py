"""OptimizerSpec: one optimizer's options read once from the flat args, checked without building anything, built once.

Table tests: what `from_args` reads for each optimizer; each refusal (a bad name, an unknown option, a bad value)
with the message the optimizer itself gives, raised while no torch optimizer and no module can be made; and the
built optimizer's param groups, equal to what `create_optimizer` builds from the same options.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hf_fasttrain.optim import OPTIMIZERS, check_optimizer_options, create_optimizer, trainer_optimizer_kwargs
from hf_fasttrain.optim.spec import OPTIMIZER_NAMES, OptimizerSpec

from conftest import make_tiny_gpt2


def _args(optimizer, optimizer_kwargs=None, **given):
    fields = dict(learning_rate=1e-3, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
    fields.update(given)
    return SimpleNamespace(optimizer=optimizer, optimizer_kwargs=optimizer_kwargs, **fields)


def test_the_typed_names_are_the_registry():
    assert OPTIMIZER_NAMES == tuple(OPTIMIZERS) == ("adamw", "lion", "ademamix", "soap", "muon")


@pytest.mark.parametrize("args, steps, expected", [
    # adamw: the Trainer's betas and eps are its own
    (_args("adamw"), None, {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.999), "eps": 1e-8}),
    (_args("adamw", adam_beta2=0.95, adam_epsilon=1e-6), None,
     {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.95), "eps": 1e-6}),
    # lion: no Adam betas; a JSON string is parsed and "0.98" made a number
    (_args("lion", '{"betas": [0.9, "0.98"], "cautious": "true"}'), None,
     {"lr": 1e-3, "weight_decay": 0.1, "betas": [0.9, 0.98], "cautious": True}),
    # ademamix: the warmup spans the run when its length is known; optimizer_kwargs come last
    (_args("ademamix", {"alpha": 8.0}), 500, {"lr": 1e-3, "weight_decay": 0.1, "T_alpha_beta3": 500, "alpha": 8.0}),
    (_args("ademamix", adam_beta2=0.99), None, {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.99, 0.9999)}),
    # soap and muon keep their own betas at the Trainer's defaults, take the ones set away from them
    (_args("soap"), None, {"lr": 1e-3, "weight_decay": 0.1}),
    (_args("soap", adam_beta2=0.99), None, {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.95, 0.99)}),
    (_args("muon", adam_beta2=0.99), None, {"lr": 1e-3, "weight_decay": 0.1, "betas": (0.9, 0.99)}),
    # optimizer_kwargs override learning_rate / weight_decay; group options travel whole
    (_args("muon", {"lr": "2e-3", "weight_decay": 0, "lr_multipliers": {"embedding": "16"},
                    "weight_decay_on": "matrices", "adamw_lr_ratio": 0.25}), 100,
     {"lr": 2e-3, "weight_decay": 0, "lr_multipliers": {"embedding": 16}, "weight_decay_on": "matrices",
      "adamw_lr_ratio": 0.25}),
])
def test_from_args_reads_what_a_trainer_run_gives(args, steps, expected):
    spec = OptimizerSpec.from_args(args, num_training_steps=steps)
    assert spec.name == args.optimizer
    assert spec.kwargs == expected
    assert list(spec.kwargs) == list(expected)  # lr, weight decay, then the options in the order given
    assert (spec.lr, spec.weight_decay) == (expected["lr"], expected["weight_decay"])
    assert trainer_optimizer_kwargs(args, num_training_steps=steps) == expected


def test_the_budget_plans_optimizer_spec_carries_budget_awares_options(tmp_path):
    """budget_aware's plan step builds the spec from the measured options merged into the given ones; the
    arguments keep theirs."""
    from conftest import tiny_args

    from hf_fasttrain.config.plan import RunPlan

    args = tiny_args(tmp_path, max_steps=2, lr_decay="cosine", optimizer="adamw",
                     optimizer_kwargs={"weight_decay_on": "matrices"})
    plan = RunPlan.from_args(args, row_length=32).with_budget(args, 512)  # 1 token per parameter: the short row
    spec = plan.optimizer
    assert spec.options["lr_multipliers"] == {"embedding": 16.0}
    assert spec.options["weight_decay_on"] == "matrices"  # the user's own option stays
    assert args.optimizer_kwargs == {"weight_decay_on": "matrices"}


@pytest.fixture
def nothing_is_built(monkeypatch):
    """Any torch optimizer or module made from here on fails the test."""
    def refuse(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__} was built during validation")

    monkeypatch.setattr(torch.optim.Optimizer, "__init__", refuse)
    monkeypatch.setattr(nn.Module, "__init__", refuse)


# (name, options, the exact one-line message): raised by the spec with nothing built, and by building the optimizer
REFUSED = [
    ("adamw", {"betas": [0.9, 1.5]}, "betas: got [0.9, 1.5] for AdamW; must be a list of 2 numbers in [0, 1)"),
    ("adamw", {"weight_decay": -1.0}, "weight_decay: got -1.0 for AdamW; must be a finite number >= 0"),
    ("adamw", {"cautious": True, "fused": True},
     "fused: got True with cautious=True, which has no fused kernel; leave fused unset or false"),
    ("lion", {"lr": -1e-4}, "lr: got -0.0001 for Lion; must be a finite number >= 0"),
    ("lion", {"cautious": "yes"}, "cautious: got 'yes' for Lion; must be true or false"),
    ("ademamix", {"T_alpha_beta3": 0}, "T_alpha_beta3: got 0 for AdEMAMix; must be an integer >= 1"),
    ("ademamix", {"betas": [0.9, 0.999]}, "betas: got [0.9, 0.999] for AdEMAMix; must be a list of 3 numbers in [0, 1)"),
    ("soap", {"skinny_ratio": 0.5}, "skinny_ratio: got 0.5 for SOAP; must be a finite number >= 1 or null (off)"),
    ("soap", {"precondition_frequency": 0}, "precondition_frequency: got 0 for SOAP; must be an integer >= 1"),
    ("muon", {"ns_dtype": "fp16"}, "ns_dtype: got 'fp16' for Muon; allowed: bfloat16, float32, auto"),
    ("muon", {"momentum": 1.0}, "momentum: got 1.0 for Muon; must be a number in [0, 1)"),
    ("muon", {"adamw_lr_ratio": 0}, "adamw_lr_ratio: got 0 for Muon; must be a finite number > 0"),
    ("muon", {"adamw_lr_ratio": 0.25, "muon_lr": 0.02},
     "adamw_lr_ratio: got 0.25 with muon_lr 0.02; it sets the AdamW part's lr from Muon's; give adamw_lr_ratio or "
     "muon_lr, not both"),
    ("muon", {"hyperball": True, "cautious_wd": True},
     "hyperball: got True with cautious_wd=True, which would do nothing (hyperball replaces weight decay on the Muon "
     "matrices); use one of them"),
    ("muon", {"normuon_beta2": 1.0}, "normuon_beta2: got 1.0 for Muon; must be null (plain Muon) or a number in [0, 1)"),
    ("lion", {"lr_multipliers": {"embeddings": 2}},
     "lr_multipliers: unknown group 'embeddings'; groups: embedding, head, norm, bias, matrix, router"),
    ("muon", {"weight_decay_on": "all"}, "weight_decay_on: got 'all'; one of default, matrices"),
]


@pytest.mark.parametrize("name, options, message", REFUSED)
def test_a_bad_value_is_refused_with_the_optimizers_message_and_nothing_built(name, options, message, monkeypatch):
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))  # made before anything is refused
    with pytest.raises(ValueError) as built:
        create_optimizer(name, model, **options)
    assert str(built.value) == message  # what building says, today and before
    with monkeypatch.context() as patch:
        def refuse(self, *args, **kwargs):
            raise AssertionError(f"{type(self).__name__} was built during validation")

        patch.setattr(torch.optim.Optimizer, "__init__", refuse)
        patch.setattr(nn.Module, "__init__", refuse)
        with pytest.raises(ValueError) as checked:
            OptimizerSpec.of(name, **options).validate(sharding="single")
        assert str(checked.value) == message
        with pytest.raises(ValueError) as checked:
            check_optimizer_options(name, **options)
        assert str(checked.value) == message


@pytest.mark.parametrize("make, message", [
    (lambda: OptimizerSpec.of("adam"), "optimizer: got 'adam'; allowed: adamw, lion, ademamix, soap, muon "
                                       "(did you mean 'adamw'?)"),
    (lambda: OptimizerSpec.from_args(_args("Muon")), "optimizer: got 'Muon'; allowed: adamw, lion, ademamix, soap, "
                                                     "muon (did you mean 'muon'?)"),
    (lambda: OptimizerSpec.of("lion", beta=(0.9, 0.99)),
     "optimizer_kwargs: lion has no option 'beta'; allowed: ['lr', 'weight_decay', 'betas', 'cautious', "
     "'lr_multipliers', 'weight_decay_on', 'parameterization', 'base_width', 'width', 'base_depth', 'base_head_dim']. Did you mean 'betas'?"),
    (lambda: OptimizerSpec.from_args(_args("soap", '{"shampoo": 0.9}')),
     "optimizer_kwargs: soap has no option 'shampoo'; allowed: ['lr', 'weight_decay', 'betas', 'shampoo_beta', "
     "'eps', 'precondition_frequency', 'max_precond_dim', 'precondition_1d', 'skinny_ratio', 'lr_multipliers', "
     "'weight_decay_on', 'parameterization', 'base_width', 'width', 'base_depth', 'base_head_dim']. Did you mean 'shampoo_beta'?"),
    (lambda: OptimizerSpec("lion", options={"lr": 1e-4}), "OptimizerSpec: give lr as its own field, not in options"),
])
def test_a_bad_name_or_option_is_refused_when_the_spec_is_made(make, message, nothing_is_built):
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value) == message


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_good_options_pass_with_nothing_built(name, nothing_is_built):
    options = {"lr_multipliers": {"embedding": 4}, "weight_decay_on": "matrices"}
    spec = OptimizerSpec.of(name, lr=3e-3, **options)
    assert spec.validate(sharding="ddp") is spec
    check_optimizer_options(name, lr=3e-3, **options)


def test_sharding_is_checked_before_the_values(nothing_is_built):
    spec = OptimizerSpec.of("soap", skinny_ratio=0.5)
    with pytest.raises(ValueError, match="^optimizer: 'soap' does not work under DeepSpeed ZeRO"):
        spec.validate(sharding="deepspeed")
    with pytest.raises(ValueError, match="^skinny_ratio: got 0.5 for SOAP"):
        spec.validate(sharding="single")


def test_fast_training_arguments_refuse_a_bad_value_without_a_probe(tmp_path, monkeypatch):
    from hf_fasttrain import FastTrainingArguments

    args = FastTrainingArguments(output_dir=str(tmp_path), optimizer="muon", report_to="none",
                                 optimizer_kwargs='{"ns_steps": "5"}')
    assert args.optimizer_kwargs == {"ns_steps": 5}  # parsed in place
    monkeypatch.setattr(torch.optim.Optimizer, "__init__", lambda self, *a, **k: pytest.fail("an optimizer was built"))
    with pytest.raises(ValueError, match=r"^ns_steps: got 0 for Muon; must be an integer in \[1, 99\]$"):
        FastTrainingArguments(output_dir=str(tmp_path), optimizer="muon", report_to="none",
                              optimizer_kwargs={"ns_steps": 0})


def _tiny_gpt2():
    return make_tiny_gpt2(64, 16, n_embd=16, n_layer=1)


def _groups(optimizer):
    """Each param group's keys and values, the parameters by name."""
    return [{k: (v if k != "params" else len(v)) for k, v in g.items()} for g in optimizer.param_groups]


@pytest.mark.parametrize("args, steps", [
    (_args("adamw", {"lr_multipliers": {"embedding": 16}}), None),
    (_args("lion", {"weight_decay_on": "matrices"}, learning_rate=1e-4, weight_decay=1.0), None),
    (_args("ademamix", {"alpha": 8.0}), 500),
    (_args("soap", adam_beta2=0.99), None),
    (_args("muon", {"adamw_lr_ratio": 0.25, "cautious_wd": True}, learning_rate=2e-2), None),
])
def test_build_gives_create_optimizers_param_groups(args, steps):
    spec = OptimizerSpec.from_args(args, num_training_steps=steps)
    built = spec.build(_tiny_gpt2(), sharding="single")
    kwargs = dict(spec.kwargs)
    direct = create_optimizer(args.optimizer, _tiny_gpt2(), sharding="single", **kwargs)
    assert type(built) is type(direct)
    assert _groups(built) == _groups(direct)
    assert built.defaults == direct.defaults


def test_build_on_a_tiny_model_exact_groups():
    net = nn.Sequential(nn.Linear(2, 4), nn.LayerNorm(4))
    opt = OptimizerSpec.of("lion", lr=1e-4, lr_multipliers={"norm": 0.5}).build(net, sharding="single")
    assert [(g["param_names"], g["lr"], g["weight_decay"]) for g in opt.param_groups] == [
        (["0.weight"], 1e-4, 1.0), (["1.weight", "1.bias"], 0.5e-4, 0.0), (["0.bias"], 1e-4, 0.0)]


@pytest.mark.parametrize("spec, native, device, max_steps, starts", [
    (OptimizerSpec.of("muon", ns_dtype="bfloat16"), False, "cpu", 10, ["muon: this CPU multiplies bf16 matrices"]),
    (OptimizerSpec.of("muon", ns_dtype="bfloat16"), True, "cpu", 10, []),
    (OptimizerSpec.of("muon"), False, "cpu", 10, []),  # auto runs fp32 there: nothing to say
    (OptimizerSpec.of("muon", ns_dtype="bfloat16"), False, "cuda", 10, []),
    (OptimizerSpec.of("ademamix"), False, "cpu", 1200, ["ademamix: beta3 0.9999 gives the slow momentum a half-life "
                                                        "of 6,931 steps, longer than this run (1,200 steps)"]),
    (OptimizerSpec.of("ademamix", T_alpha_beta3=10_000), False, "cpu", 1200, []),  # the warmup's length counts
    (OptimizerSpec.of("ademamix", betas=[0.9, 0.999, 0.999]), False, "cpu", 500,
     ["ademamix: beta3 0.999 gives the slow momentum a half-life of 693 steps, longer than this run (500 steps)"]),
    (OptimizerSpec.of("ademamix"), False, "cpu", -1, []),  # an epoch-based run: its length is not known
    (OptimizerSpec.of("adamw"), False, "cpu", 10, []),
])
def test_notes(spec, native, device, max_steps, starts, monkeypatch):
    import hf_fasttrain.optim.orthogonalize as orth

    monkeypatch.setattr(orth, "native_bf16_matmul", lambda device="cpu": native)
    notes = spec.notes(device=torch.device(device), max_steps=max_steps)
    assert len(notes) == len(starts)
    for note, start in zip(notes, starts):
        assert note.startswith(start)


def test_optimizer_cls_and_kwargs_for_checks_values_before_the_trainer_exists(nothing_is_built):
    from hf_fasttrain.optim import optimizer_cls_and_kwargs_for

    with pytest.raises(ValueError) as err:
        optimizer_cls_and_kwargs_for("lion", lr=1e-4, weight_decay=1.0, betas=[0.9, 2])
    assert str(err.value) == "betas: got [0.9, 2] for Lion; must be a list of 2 numbers in [0, 1)"
    args = SimpleNamespace(learning_rate=1e-3, weight_decay=0.1, max_steps=100)
    with pytest.raises(ValueError) as err:
        optimizer_cls_and_kwargs_for("ademamix", args, alpha=-1.0)
    assert str(err.value) == "alpha: got -1.0 for AdEMAMix; must be a finite number >= 0"
    factory, kwargs = optimizer_cls_and_kwargs_for("ademamix", args, alpha=8.0)
    assert kwargs == {"lr": 1e-3, "weight_decay": 0.1, "T_alpha_beta3": 100, "alpha": 8.0}


def test_the_spec_modules_examples_run():
    import doctest
    import re

    import hf_fasttrain.optim.spec as module

    for obj in (module.OptimizerSpec, module.parse_optimizer_kwargs):
        doc = re.sub(r"^\s*```\w*\s*$", "", obj.__doc__, flags=re.M)
        test = doctest.DocTestParser().get_doctest(doc, dict(vars(module)), obj.__name__, None, 0)
        assert test.examples
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        runner.run(test, out=lambda s: None)
        assert runner.summarize(verbose=False).failed == 0, obj.__name__
