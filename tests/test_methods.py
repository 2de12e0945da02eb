"""methods.py: the methods table and its flags. Each method's recipe is the default of the flags not given, and every
flag the table says a method ignores is refused in one line naming it, while every other flag is taken."""
import pytest

from lab import methods
from lab import train  # the lab's trainer: every method

VALUES = {  # one valid value of every method flag (None: a switch)
    "lam": "0.2", "view_pooling": "max", "teacher_dropout": "off", "layers": "1:", "tau": "0.2", "aug1": "shuffle",
    "aug2": "shuffle", "no_proj": None, "proj_size": "8", "eval_every": "5", "patience": "3", "early_stop": "best",
    "select": "any",    "overfit_batch": None, "eval_pooling": "mean", "lr": "1e-3", "weight_decay": "0.1", "batch_size": "8",
    "epochs": "2", "dropout": "off", "pooling": "mean", "whiten_dim": "4", "template": 'A "[X]" is [MASK] .',
    "template2": 'B "[X]" is [MASK] .', "dup_rate": "0.2", "queue_size": "32", "momentum": "0.9", "neg_layers": "1",
    "momentum_init": "pretrained",
    "generator": "g", "rtd_weight": "0.01", "mask_rate": "0.2",
    # ... and of every run flag: a method may ignore those too (the post-hoc fits: --precision)
    "model": "m", "data": "d.txt", "data_dir": "dd", "max_len": "16", "max_steps": "3", "out": "o.safetensors",
    "overwrite": None, "json": "r.json", "eval_all": None, "eval_only": None, "seed": "7", "device": "cpu",
    "precision": "bf16", "log_every": "2", "eval_batch_size": "16"}


def argv(loss, name):
    flag = "--" + name.replace("_", "-")
    return ["--loss", loss, flag] + ([] if VALUES[name] is None else [VALUES[name]])


def test_method_recipes_are_defaults_that_flags_override():
    a = methods.resolve_config(train.get_args(["--loss", "consert"]))
    assert (a.tau, a.batch_size, a.max_len, a.lr, a.dropout, a.aug1, a.aug2, a.pooling, a.eval_pooling) == \
        (0.1, 96, 64, 5e-7, "off", "feature-cutoff:0.2", "shuffle", "mean", "last2")
    a = methods.resolve_config(train.get_args(["--loss", "simcse", "--tau", "0.1", "--batch-size", "8"]))
    assert (a.tau, a.batch_size, a.max_len, a.lr, a.pooling) == (0.1, 8, 32, 3e-5, "cls")
    a = methods.resolve_config(train.get_args([]))
    assert (a.tau, a.batch_size, a.max_len, a.lr, a.aug1, a.eval_pooling) == (0.01, 16, 128, 5e-5, "none", "cls")
    a = methods.resolve_config(train.get_args(["--loss", "promptbert"]))
    assert (a.batch_size, a.lr, a.template, a.pooling) == (256, 1e-5, methods.prompt.TRAIN_TEMPLATES[0], "prompt")
    a = methods.resolve_config(train.get_args(["--loss", "esimcse", "--lr", "1e-4"]))
    assert (a.tau, a.batch_size, a.max_len, a.lr, a.dup_rate, a.queue_size, a.momentum) == (0.05, 64, 32, 1e-4, 0.32,
                                                                                            160, 0.995)
    a = methods.resolve_config(train.get_args(["--loss", "sscl"]))
    assert (a.tau, a.batch_size, a.lr, a.pooling, a.eval_pooling, a.neg_layers) == (0.05, 64, 3e-5, "mean", "mean", 2)
    a = methods.resolve_config(train.get_args(["--loss", "diffcse", "--model", "m", "--generator", "g"]))
    assert (a.tau, a.batch_size, a.lr, a.rtd_weight, a.mask_rate, a.generator) == (0.05, 64, 7e-6, 0.005, 0.3, "g")
    assert methods.resolve_config(train.get_args(["--loss", "diffcse", "--model", "m"])).generator == "m"


@pytest.mark.parametrize("loss", list(methods.METHODS))
def test_every_recipe_key_is_a_flag_and_every_flag_not_ignored_is_taken(loss):
    m, flags = methods.METHODS[loss], vars(train.get_args([]))
    assert set(m.recipe) <= set(flags) and set(VALUES) == set(flags) - {"loss", "given"}  # every flag, each method
    for name in sorted(set(VALUES) - set(m.ignores)):
        if loss not in methods.OWN_FLAGS.get(name, (loss,)):
            continue  # another method's own setting: refused below
        cfg = methods.resolve_config(train.get_args(argv(loss, name)))
        assert getattr(cfg, name) == (True if VALUES[name] is None else type(getattr(cfg, name))(VALUES[name]))


# The fitted maps' rows, written out from what train.fit_posthoc and posthoc.py read: no contrast and no loop (no dev
# evaluation, early stop or autocast), and for the whitening no gradient step at all (nor a seed: no dropout either).
# The contrastive methods run train.py's loop, which reads every run flag.
COMMON = {"model", "data", "data_dir", "max_len", "pooling", "out", "overwrite", "json", "eval_all", "eval_only",
          "device", "eval_batch_size"}
FITTED = {"whitening": COMMON | {"whiten_dim"},
          "flow": COMMON | {"lr", "weight_decay", "batch_size", "epochs", "max_steps", "log_every", "dropout", "seed"}}


@pytest.mark.parametrize("loss", list(methods.METHODS))
def test_every_flag_a_method_does_not_take_is_refused_in_one_line(loss, capsys):
    """Every method x every flag of train.py (VALUES: the test above keeps it complete, so a new flag lands here):
    taken (methods.takes) and accepted, or refused in one line naming the flag and the method."""
    for name in VALUES:
        if methods.takes(loss, name):
            methods.resolve_config(train.get_args(argv(loss, name)))
            continue
        with pytest.raises(SystemExit) as e:
            methods.resolve_config(train.get_args(argv(loss, name)))
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1, (name, err)
        assert f"--{name.replace('_', '-')} means nothing for --loss {loss}" in err and err.endswith("drop it"), err
    if loss in FITTED:
        assert {n for n in VALUES if methods.takes(loss, n)} == FITTED[loss]


def test_proj_size_with_no_proj_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        methods.resolve_config(train.get_args(["--no-proj", "--proj-size", "16"]))
    assert e.value.code == 2 and "--proj-size means nothing with --no-proj" in capsys.readouterr().err


def test_whitening_and_flow_fit_on_the_64_tokens_their_codes_read():
    for loss in ("whitening", "flow"):
        assert methods.resolve_config(train.get_args(["--loss", loss])).max_len == 64


def test_the_pooling_choices_are_berts():
    import bert
    import cli
    p = cli.parser("x", "")
    methods.add_method_flags(p.add_argument)
    assert {tuple(a.choices) for a in p._actions if a.dest in ("pooling", "eval_pooling")} == {bert.POOLINGS}


def test_takes_answers_as_the_refusals_do():
    assert methods.takes("opt", "--lam") and methods.takes("opt", "lam") and not methods.takes("simcse", "--lam")
    assert methods.takes("whitening", "--whiten-dim") and not methods.takes("opt", "whiten-dim")
    assert methods.takes("promptbert", "--template2") and not methods.takes("promptbert", "--aug1")
    assert not methods.takes("whitening", "--lr") and methods.takes("flow", "--lr")
    assert methods.takes("sscl", "--neg-layers") and methods.takes("sg-opt-sscl", "--neg-layers")  # two owners
    assert not methods.takes("opt", "--neg-layers") and not methods.takes("simcse", "--momentum")
