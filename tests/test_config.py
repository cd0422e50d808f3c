"""Config: precedence of sources, strict keys and types, validation, field docs."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from agent.config import Config, config_reference, field_docs
from agent.config_files import CONFIG_DIR, config_from_dict, load_config, parse_set
from agent.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    d = tmp_path / "configs"
    d.mkdir()
    _write(d / "default.yaml", {"lr": 0.001, "batch_size": 32, "total_steps": 10_000})
    _write(d / "Toy-v0.yaml", {"lr": 0.002, "batch_size": 16})
    _write(d / "atari.yaml", {"hidden_sizes": [512]})
    _write(d / "minatar.yaml", {"hidden_sizes": [128]})
    _write(d / "MinAtar_Freeway-v0.yaml", {"hidden_sizes": [64]})
    return d


def test_precedence_defaults_env_file_config_file_set(config_dir: Path, tmp_path: Path) -> None:
    cfg = load_config("Toy-v0", config_dir=config_dir)
    assert (cfg.lr, cfg.batch_size, cfg.total_steps) == (0.002, 16, 10_000)
    user = _write(tmp_path / "mine.yaml", {"batch_size": 8, "gamma": 0.9})
    cfg = load_config("Toy-v0", user, config_dir=config_dir)
    assert (cfg.lr, cfg.batch_size, cfg.gamma) == (0.002, 8, 0.9)
    cfg = load_config("Toy-v0", user, {"gamma": 0.5}, config_dir=config_dir)
    assert cfg.gamma == 0.5 and cfg.batch_size == 8
    assert cfg.env_id == "Toy-v0"
    # An env without its own file gets the defaults; ALE ids share atari.yaml.
    assert load_config("Other-v0", config_dir=config_dir).lr == 0.001
    assert load_config("ALE/Pong-v5", config_dir=config_dir).hidden_sizes == [512]
    # MinAtar ids share minatar.yaml, unless a game has its own file.
    assert load_config("MinAtar/Breakout-v1", config_dir=config_dir).hidden_sizes == [128]
    assert load_config("minatar:MinAtar/Asterix-v0", config_dir=config_dir).hidden_sizes == [128]
    assert load_config("MinAtar/Freeway-v0", config_dir=config_dir).hidden_sizes == [64]


def test_unknown_key_is_rejected_with_a_suggestion(config_dir: Path) -> None:
    with pytest.raises(UserError, match=r"unknown config key 'lrr' in --set \(did you mean lr\?\)"):
        load_config("Toy-v0", overrides={"lrr": 0.1}, config_dir=config_dir)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("lr", "fast"),
        ("batch_size", 3.5),
        ("batch_size", True),
        ("dueling", "yes"),
        ("hidden_sizes", 64),
        ("hidden_sizes", [64, "x"]),
        ("loss", "l1"),
        ("max_grad_norm", "none"),
        ("noise_interval", "step"),
        ("noise_interval", 2.5),
        ("epsilon_decay_start", "learning"),
        ("epsilon_decay_start", 1.5),
        ("epsilon_decay_start", True),
    ],
)
def test_wrong_types_are_rejected(config_dir: Path, key: str, value: object) -> None:
    with pytest.raises(UserError, match=f"config key '{key}' in --set must be"):
        load_config("Toy-v0", overrides={key: value}, config_dir=config_dir)


def test_noise_interval_takes_a_step_count_or_episode(config_dir: Path) -> None:
    cfg = load_config("Toy-v0", overrides={"noise_interval": 4}, config_dir=config_dir)
    assert cfg.noise_interval == 4
    cfg = load_config("Toy-v0", overrides={"noise_interval": "episode"}, config_dir=config_dir)
    assert cfg.noise_interval == "episode"


def test_the_epsilon_decay_starts_at_a_step_or_when_learning_starts(config_dir: Path) -> None:
    """A step count, or learning_starts (resolved to the config's learning_starts where
    the exploration is built); a negative step is one line naming the fix. The key rides
    in the saved config, so a resume builds the same schedule."""
    from agent.setup import build_exploration

    assert load_config("Toy-v0", config_dir=config_dir).epsilon_decay_start == 0
    for value, step in ((250, 250), ("learning_starts", 1_000)):
        cfg = load_config("Toy-v0", overrides={"epsilon_decay_start": value,
                                               "learning_starts": 1_000}, config_dir=config_dir)
        assert cfg.epsilon_decay_start == value
        resumed = config_from_dict(yaml.safe_load(yaml.safe_dump(cfg.to_dict())), "last.pt")
        assert resumed.epsilon_decay_start == value
        assert build_exploration(resumed, 2).decay_start == step
    cfg = load_config("Toy-v0", overrides=parse_set(["epsilon_decay_start=learning_starts"]),
                      config_dir=config_dir)
    assert cfg.epsilon_decay_start == "learning_starts"
    with pytest.raises(UserError) as e:
        load_config("Toy-v0", overrides={"epsilon_decay_start": -1}, config_dir=config_dir)
    assert str(e.value) == ("invalid config: epsilon_decay_start must be >= 0 or "
                            "learning_starts, got -1: --set epsilon_decay_start=0")


def test_a_warm_up_the_user_set_must_end_before_the_run_does(
    config_dir: Path, tmp_path: Path
) -> None:
    _write(config_dir / "Long-v0.yaml", {"random_starts": 50_000})
    # Set by the user, in --set or a config file: one line naming the fix.
    for where in ({"overrides": {"random_starts": 10_000}},
                  {"config_file": _write(tmp_path / "warm.yaml", {"random_starts": 12_000})},
                  {"overrides": {"random_starts": 40_000}, "env_id": "Long-v0"}):
        env_id = where.pop("env_id", "Toy-v0")
        with pytest.raises(UserError, match=r"random_starts \(\d[\d,]*\) is not shorter than the "
                           r"run \(total_steps 10,000\).*--set random_starts=N with N < 10000"):
            load_config(env_id, config_dir=config_dir, **where)
    # The env's own default outlasting a short trial run is only announced by train.
    assert load_config("Long-v0", config_dir=config_dir).random_starts == 50_000
    assert load_config("Toy-v0", overrides={"random_starts": 9_999},
                       config_dir=config_dir).random_starts == 9_999


def test_ints_are_accepted_for_floats_and_null_for_optionals(config_dir: Path) -> None:
    cfg = load_config("Toy-v0", overrides={"lr": 1, "max_grad_norm": None}, config_dir=config_dir)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float) and cfg.max_grad_norm is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"lr": 0.0}, "lr must be > 0"),
        ({"gamma": 0.0}, r"gamma must be in \(0, 1\]"),
        ({"gamma": 1.5}, r"gamma must be in \(0, 1\]"),
        ({"batch_size": 64, "buffer_size": 32}, "larger than buffer_size"),
        ({"n_step": 0}, "n_step must be >= 1"),
        ({"learning_starts": 20_000}, "learning_starts"),
        ({"tau": 0.0}, "tau"),
        ({"device": "tpu"}, "device"),
        ({"exploration": "noisy", "noisy_layers": "none"}, "needs noisy layers"),
        ({"seed": -1}, "seed"),
        ({"noise_interval": 0}, "noise_interval must be >= 1 or episode"),
        ({"update_noise": -0.5}, "update_noise must be >= 0"),
        ({"noisy_epsilon": 1.5}, r"noisy_epsilon must be in \[0, 1\]"),
        ({"learner_backend": "numpy", "learner_autocast": "bfloat16"},
         "needs an autograd learner backend"),
    ],
)
def test_invalid_values_are_rejected(config_dir: Path, overrides: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_config("Toy-v0", overrides=overrides, config_dir=config_dir)


def test_bad_files(tmp_path: Path, config_dir: Path) -> None:
    with pytest.raises(UserError, match="cannot read config file"):
        load_config("Toy-v0", tmp_path / "missing.yaml", config_dir=config_dir)
    bad = tmp_path / "bad.yaml"
    bad.write_text("lr: [1,\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config("Toy-v0", bad, config_dir=config_dir)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="mapping"):
        load_config("Toy-v0", listy, config_dir=config_dir)


def test_a_config_file_lays_itself_over_its_base(config_dir: Path, tmp_path: Path) -> None:
    """A preset's name or a path from the naming file's folder, to any depth; the file's own
    settings win over its base's, and --set over both."""
    (config_dir / "presets").mkdir()
    _write(config_dir / "presets" / "small.yaml", {"batch_size": 4, "gamma": 0.8, "lr": 0.01})
    _write(config_dir / "presets" / "smaller.yaml", {"base": "small", "batch_size": 2})
    cfg = load_config("Toy-v0", "smaller", config_dir=config_dir)
    assert (cfg.batch_size, cfg.gamma, cfg.lr) == (2, 0.8, 0.01)
    (tmp_path / "mine").mkdir()
    _write(tmp_path / "mine" / "a.yaml", {"base": "smaller", "gamma": 0.7})
    _write(tmp_path / "mine" / "b.yaml", {"base": "a.yaml", "lr": 0.03})
    cfg = load_config("Toy-v0", tmp_path / "mine" / "b.yaml", {"lr": 0.05}, config_dir)
    assert (cfg.batch_size, cfg.gamma, cfg.lr) == (2, 0.7, 0.05)
    # An env file's settings that no file of the chain sets stay.
    assert load_config("Toy-v0", "small", config_dir=config_dir).total_steps == 10_000


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a.yaml": {"base": "b.yaml"}, "b.yaml": {"base": "a.yaml", "lr": 0.1}},
         r"the config files' bases go round \(.*a\.yaml -> .*b\.yaml -> .*a\.yaml\)"),
        ({"a.yaml": {"base": "a.yaml"}}, "bases go round"),
        ({"a.yaml": {"base": "nope"}},
         r"base: nope in .*a\.yaml: no preset of that name \(shipped presets: none\)"),
        ({"a.yaml": {"base": ["der"]}}, r"'base' in .*a\.yaml must be a preset's name"),
        ({"a.yaml": {"base": "missing.yaml"}}, "cannot read config file .*missing.yaml"),
        ({"a.yaml": {"base": "b.yaml"}, "b.yaml": {"lrr": 1}}, r"unknown config key 'lrr' in .*b"),
    ],
)
def test_bad_bases_are_user_errors(
    config_dir: Path, tmp_path: Path, files: dict, message: str
) -> None:
    for name, data in files.items():
        _write(tmp_path / name, data)
    with pytest.raises(UserError, match=message):
        load_config("Toy-v0", tmp_path / "a.yaml", config_dir=config_dir)


def test_parse_set_reads_yaml_values(config_dir: Path) -> None:
    # YAML 1.1 reads 3e-4 (no dot) as a string; float keys still accept it.
    assert load_config("Toy-v0", overrides=parse_set(["lr=3e-4"]), config_dir=config_dir).lr == 3e-4
    assert parse_set(["lr=0.1", "hidden_sizes=[128, 128]", "dueling=true", "target_return="]) == {
        "lr": 0.1,
        "hidden_sizes": [128, 128],
        "dueling": True,
        "target_return": None,
    }
    with pytest.raises(UserError, match="key=value"):
        parse_set(["lr"])


def test_every_field_has_a_doc_and_the_shipped_defaults_are_complete() -> None:
    docs = field_docs()
    names = [f.name for f in dataclasses.fields(Config)]
    assert sorted(docs) == sorted(names)
    assert all(len(doc) > 10 for doc in docs.values())
    shipped = yaml.safe_load((CONFIG_DIR / "default.yaml").read_text())
    assert sorted(shipped) == sorted(n for n in names if n != "env_id")


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_config_files_load(path: Path) -> None:
    env_id = path.stem if path.stem not in ("default", "atari") else "CartPole-v1"
    load_config(env_id, path)


def test_the_configuration_reference_has_every_key_once_in_a_page_that_includes_it() -> None:
    reference = config_reference()
    rows = re.findall(r"^\| `(\w+)` \|", reference, flags=re.MULTILINE)
    assert sorted(rows) == sorted(f.name for f in dataclasses.fields(Config))
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert "<!-- config-reference -->" in page  # replaced by the reference when the site builds


def test_env_kwargs_is_a_checked_mapping(config_dir: Path) -> None:
    cfg = load_config(
        "Toy-v0", overrides=parse_set(["env_kwargs={goal_velocity: 0.02}"]), config_dir=config_dir
    )
    assert cfg.env_kwargs == {"goal_velocity": 0.02}
    assert load_config("Toy-v0", config_dir=config_dir).env_kwargs == {}
    for bad in ([1], "x", {1: 2}):
        with pytest.raises(UserError, match="'env_kwargs' in --set must be a mapping"):
            load_config("Toy-v0", overrides={"env_kwargs": bad}, config_dir=config_dir)
    with pytest.raises(UserError, match="env_kwargs cannot set render_mode"):
        load_config(
            "Toy-v0", overrides={"env_kwargs": {"render_mode": "human"}}, config_dir=config_dir
        )
    # The saved config.yaml round-trips it.
    saved = yaml.safe_load(yaml.safe_dump(cfg.to_dict()))
    assert config_from_dict(saved, "config.yaml").env_kwargs == {"goal_velocity": 0.02}


def test_defaults_agree_in_the_dataclass_default_yaml_and_the_reference() -> None:
    # A change to the dataclass that misses default.yaml would make `Config()` and an env
    # without a YAML disagree; the reference is generated from the dataclass.
    shipped = yaml.safe_load((CONFIG_DIR / "default.yaml").read_text())
    rows = dict(re.findall(r"^\| `(\w+)` \| `([^`]*)` \|", config_reference(), flags=re.MULTILINE))
    defaults = Config().to_dict()
    del defaults["env_id"]  # the one key default.yaml leaves to --env
    disagree = [
        (key, value, shipped[key], rows[key])
        for key, value in defaults.items()
        if not value == shipped[key] == yaml.safe_load(rows[key])
    ]
    assert disagree == [], f"(key, dataclass, default.yaml, reference): {disagree}"


def test_a_checkout_reads_the_top_level_configs_folder() -> None:
    assert CONFIG_DIR == ROOT / "configs"
    assert (CONFIG_DIR / "default.yaml").is_file()
    # A YAML left in agent/configs/ would be shadowed in the checkout (or shadow the rest).
    assert not (ROOT / "agent" / "configs").exists()


def test_the_wheel_ships_configs_as_agent_configs_and_reads_them_installed(
    tmp_path: Path,
) -> None:
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 68:
        pytest.skip("the build needs setuptools >= 68 (pyproject.toml's build-system)")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("agent", "envs", "configs"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "-w", str(tmp_path / "dist"), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    shipped = sorted(n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("agent/configs/"))
    configs = ROOT / "configs"
    assert shipped == sorted(f"agent/configs/{p.relative_to(configs).as_posix()}"
                             for p in configs.rglob("*.yaml"))  # fmt: skip
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # The installed copy of agent, imported from elsewhere, finds its configs beside it.
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import agent.config_files as c; "
        "print(c.__file__, c.CONFIG_DIR, c.load_config('CartPole-v1').total_steps, "
        "c.load_config('CartPole-v1', 'rainbow').distributional)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(site)], cwd=tmp_path, capture_output=True, text=True,
        check=True, timeout=120,
    )  # fmt: skip
    module, config_dir, total_steps, preset = out.stdout.split()
    assert preset == "True"  # the presets ship too
    assert Path(module).parent == site / "agent"
    assert Path(config_dir) == site / "agent" / "configs"
    assert int(total_steps) == yaml.safe_load((ROOT / "configs" / "CartPole-v1.yaml").read_text())[
        "total_steps"
    ]
