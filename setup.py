"""The one part of the build that pyproject.toml cannot say: the top-level configs/ folder
ships inside the agent package, as agent/configs (agent.config_files.CONFIG_DIR reads it there
in an installed wheel, and at configs/ in a checkout)."""

from setuptools import find_packages, setup

setup(
    # Every package under agent/ and envs/, none listed by hand, and configs/ as agent.configs.
    packages=[
        *find_packages(include=["agent", "agent.*", "envs", "envs.*"]),
        "agent.configs",
        "agent.configs.presets",
    ],
    package_dir={"agent.configs": "configs", "agent.configs.presets": "configs/presets"},
    package_data={"agent.configs": ["*.yaml"], "agent.configs.presets": ["*.yaml"]},
)
