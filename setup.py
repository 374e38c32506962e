"""The fork-style contribution branch for PyTorch distributed: `pip install -e .` sets up
everything (the pinned torch, test and lint tools) and installs the `torch-overlay` command."""

from setuptools import find_packages, setup

setup(
    name="torch-overlay",
    version="0.1.0",
    description="PyTorch distributed fixes carried as upstream-ready patches over torch 2.15.0",
    python_requires=">=3.10",
    packages=find_packages(include=["tools", "tools.*"]),
    package_data={"tools": ["boot/*.py", "boot/run/*.py"]},
    install_requires=[
        "torch==2.15.0",  # the pinned base: patches/base.json records its git sha and files
        "numpy==2.4.6",  # torch warns at import without it
        "ninja==1.13.2",  # torch.utils.cpp_extension builds the layout-contract test with it
        "expecttest==0.3.0",
        "pytest==9.2.0",
        "pytest-timeout==2.4.0",  # upstream-test: a hung upstream test must not stall the gate
        "ghstack==0.18.0",
        "graphql-core==3.3.2",  # ghstack's offline fake GitHub, for the stack rehearsal
        "lintrunner==0.13.1",
        "lintrunner-adapters==0.14.1",
        "ruff==0.17.6",
        "clang-format==23.1.5",
        # Upstream's flake8 and plugins, for the UPSTREAMLINT linter (tools/upstream.flake8).
        "flake8==7.5.0",
        "flake8-bugbear==23.3.23",
        "flake8-comprehensions==3.12.0",
    ],
    entry_points={"console_scripts": ["torch-overlay=tools.cli:main"]},
)
