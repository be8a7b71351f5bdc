"""The names of what tools on the host read from a project and run: protected (kept as
they were before the run, or removed), at the top (PROTECTED, PROTECTED_GLOBS) and in
every directory below it (DEEP, DEEP_GLOBS, NESTED in directories of those names), and
watched (listed when they change: WATCHED, WATCHED_GLOBS, WATCHED_DEEP). run.protected
finds them in a project, run.guard keeps them. docs/workflows.md says what is on the
lists and why."""

from __future__ import annotations

import fnmatch
import re

from .vcsconf import VCS_SETTINGS

# Other agents' and editors' project settings: the MCP servers, hooks, plugins, tasks
# and language servers they start on the host when opened here, vim's exrc, sdkman's
# environment.
AGENTS = (".gemini", ".cursor", ".codex", ".amazonq", ".roo", ".kiro", ".windsurf", ".continue", ".opencode",
          "opencode.json", "opencode.jsonc", ".qwen", ".clinerules", ".kilocode", ".crush.json", ".factory",
          ".aider.conf.yml", ".junie", "crush.json", ".zed", ".helix", ".theia", ".nvim.lua", ".nvimrc", ".exrc",
          ".vimrc", ".gvimrc", ".lazy.lua", ".dir-locals.el", ".dir-locals-2.el", ".sdkmanrc",
          # Augment's and Amp's project settings (hooks that apply to all contributors,
          # permission rules; review 34)
          ".augment", ".amp")
# Which interpreter or toolchain the host's version managers run here: uv takes a path in
# `.python-version` (review 34), pyenv and rbenv read version names as paths before
# their 2022 fixes, pdm's `.pdm-python` is the interpreter's path, proto's `.prototools`
# sets the environment and plugins of what it runs; and what interactive interpreters run
# when they start here (R's `.Rprofile` and `.Renviron`, GHCi's, irb's, pry's, IEx's).
VERSIONS = (".python-version", ".pdm-python", ".ruby-version", ".node-version", ".nvmrc", ".java-version",
            ".prototools", ".Rprofile", ".Renviron", ".ghci", ".irbrc", "irb.rc", "_irbrc", "$irbrc", ".pryrc",
            ".iex.exs",
            # pdb runs ./.pdbrc at every breakpoint() (Python statements; review 35); the
            # Haskell language server runs hie.yaml's cradle program when a file is opened
            ".pdbrc", "hie.yaml",
            # rbenv-vars', nodenv-vars' and asdf's per-project variables (RUBYOPT,
            # NODE_OPTIONS), read from every parent directory (review 36)
            ".rbenv-vars", ".nodenv-vars", ".asdf-vars")
# mise reads its configuration in every directory from the one it runs in up to the
# root, under all these names: each profile's (MISE_ENV: mise.ENV.toml) and local
# variants, and those of rtx, its former name (mise's docs, Configuration and Profiles;
# review 32: `.rtx.toml`, `.config/mise.local.toml`, `sub/mise.local.toml` stayed).
# Its early settings (`.miserc.toml`, `.config/miserc.toml`), read with no trust check,
# rename the files it then loads (override_config_filenames, override_tool_versions_
# filenames; review 33): protected like the rest.
MISE_GLOBS = (".mise.*.toml", "mise.*.toml", ".rtx.toml", ".rtx.*.toml", ".miserc.toml")
# What is protected in a directory of these names, at the top and below it (a link of
# such a name below the top is kept itself: tools read through it, review 33): mise's in
# `.config`; GitHub Copilot's (and VS Code's agent) hooks and Copilot's MCP servers in
# `.github`; Bundler's settings in `.bundle` (BUNDLE_GEMFILE names the Ruby it
# evaluates); the wrapper Bazelisk runs instead of Bazel in `tools` (review 34).
NESTED = {".config": ("mise", "mise.toml", "mise.*.toml", "miserc.toml"), ".github": ("hooks", "mcp.json"),
          ".bundle": ("config",), "tools": ("bazel", "bazel.*"), ".cargo": ("config", "config.toml")}
# The literal ones, protected at the top by path (a parent made a link there is seen).
NESTED_PATHS = tuple(f"{d}/{n}" for d, names in NESTED.items() for n in names if "*" not in n)
# Paths that execute on the host later: on `cd` (direnv, mise), in the editor (VS Code's and
# JetBrains' tasks, settings, run configurations, workspaces), when a dev container is built,
# when an agent runs there (Claude Code's hooks and MCP servers), and `.git` (below).
PROTECTED = (".git", ".gitmodules", ".envrc", ".mise.toml", "mise.toml", ".mise.local.toml", "mise.local.toml",
             ".mise", "mise", ".config/mise.toml", ".config/mise", ".vscode", ".idea", ".devcontainer",
             ".devcontainer.json", ".claude", ".mcp.json", ".run", ".fleet",
             # what package managers run when someone builds on the host: cargo's
             # rustc-wrapper and aliases, yarn's yarnPath, npm's node-options and
             # script-shell, pnpm's hooks file
             ".cargo/config.toml", ".cargo/config", ".yarnrc.yml", ".yarnrc", ".npmrc", ".pnpmfile.cjs",
             # a toolchain at a path of the workload's: rustup's `path`, mise's `path:` versions
             "rust-toolchain", "rust-toolchain.toml", ".tool-versions",
             # Mercurial's, Jujutsu's and Sapling's repository settings: extensions
             # (Python code), hooks, pagers and diff tools that `hg status`, `jj log` and
             # `sl status` run (review 15), and a shared repository's path, whose settings
             # they read instead (review 28); below the top: VCS_SETTINGS
             ".hg/hgrc", ".hg/hgrc-not-shared", ".hg/sharedpath", ".jj/repo/config.toml",
             ".jj/workspace-config.toml", ".sl/config", ".sl/sharedpath", *AGENTS, *VERSIONS,
             *(p for p in NESTED_PATHS if p not in (".config/mise", ".config/mise.toml", ".cargo/config",
                                                     ".cargo/config.toml")))
# Names of a kind at the top and in every directory below it (MISE_GLOBS: mise's
# profiles and local files, and rtx's, its former name; review 32), and editor workspaces.
PROTECTED_GLOBS = ("*.code-workspace", *MISE_GLOBS)
# Protected wherever they are in the project (below its top, outside node_modules): what
# runs on the host when someone works in that directory (direnv on cd, cargo, npm, yarn
# and pnpm when they build there, mise, Claude Code and MCP clients started there, a dev
# container opened there).
DEEP = frozenset({".envrc", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pnpmfile.cjs", ".cargo", ".mise.toml", "mise.toml",
                  ".mise", "mise", ".claude", ".mcp.json", ".devcontainer", ".devcontainer.json", ".gitmodules",
                  # an editor opened on a module's directory
                  ".vscode", ".idea", ".run", ".fleet",
                  # a toolchain at a path of the workload's: rustup's `path`, mise's `path:`
                  "rust-toolchain", "rust-toolchain.toml", ".tool-versions", *AGENTS, *VERSIONS})
# The paths of a git directory a workflow may leave to the workload for real.
SHADOWED = (".git/hooks", ".git/config", ".git/info")
# What a workflow may unprotect (unprotected_paths; the schema's enum).
UNPROTECTABLE = PROTECTED + SHADOWED + (".git/modules",)
# Changed paths a pipeline should look at before it trusts the result: CI definitions,
# build scripts and wrappers, lockfiles, hook managers, agent instructions.
WATCHED = (".github/workflows", ".gitlab-ci.yml", "Jenkinsfile", ".circleci", "azure-pipelines.yml", ".buildkite",
           "pom.xml", "mvnw", ".mvn", "build.gradle", "build.gradle.kts", "settings.gradle", "settings.gradle.kts",
           "gradlew", "gradle/wrapper", "package.json", "package-lock.json", "yarn.lock", "pnpm-lock.yaml",
           "Makefile", "setup.py", "setup.cfg", "pyproject.toml", "tox.ini", "noxfile.py", "requirements.txt",
           "poetry.lock", "uv.lock", "Pipfile.lock", "Cargo.lock", "go.sum", "Gemfile.lock", "Dockerfile",
           "docker-compose.yml", "compose.yaml", ".pre-commit-config.yaml", ".husky", "CLAUDE.md",
           "AGENTS.md", "GNUmakefile", "makefile", "go.mod", "go.work", "buildSrc", "gradle.properties",
           "docker-compose.yaml", "compose.yml", "docker-compose.override.yml", "docker-compose.override.yaml",
           "compose.override.yml", "compose.override.yaml", "Cargo.toml", "build.rs", "justfile", "Taskfile.yml",
           "Gemfile", "Rakefile", "pnpm-workspace.yaml",
           # what tools and editors' linters load and run from the project when they start
           "conftest.py", "pytest.ini", "pytest.toml", ".pytest.ini", "tox.toml", ".pylintrc", "pylintrc", "mypy.ini",
           ".mypy.ini", ".flake8", ".coveragerc",
           "eslint.config.js", "eslint.config.mjs", "eslint.config.cjs", "eslint.config.ts", ".eslintrc.js",
           ".eslintrc.cjs", "prettier.config.js", ".prettierrc.js", "jest.config.js", "jest.config.ts",
           "vite.config.js", "vite.config.ts", "vitest.config.js", "vitest.config.ts", "tailwind.config.js",
           "svelte.config.js", "babel.config.js", ".babelrc.js", "webpack.config.js",
           # other agents' instructions
           "GEMINI.md", ".cursorrules", ".windsurfrules", ".github/copilot-instructions.md",
           # what hides a file from a review of `git status` (review 15: a .gitignore that
           # ignores itself and a test beside it), drivers git runs by path, compose's and
           # tools' environment (.env: COMPOSE_FILE names another compose file)
           ".gitignore", ".gitattributes", ".env",
           # Git LFS's settings from the project (lfs.url: where the host's `git lfs pull`
           # fetches from and sends its credentials; review 47)
           ".lfsconfig",
           # review 16: local GitHub actions a watched workflow runs, other build systems'
           # entry points and tools' startup files that run code of the project's
           ".github/actions", ".gitlab", ".storybook", "CMakeLists.txt", "CMakePresets.json", "meson.build",
           "configure", "configure.ac", "build.xml", "build.sbt", "SConstruct", "Vagrantfile", "flake.nix",
           "shell.nix", "default.nix", "devenv.nix", "composer.json", "deno.json", "deno.jsonc", "WORKSPACE",
           "WORKSPACE.bazel", "MODULE.bazel", ".bazelrc", ".bazelversion", ".golangci.yml", ".golangci.yaml",
           "bunfig.toml", ".rspec", "Procfile", "Tiltfile",
           # sbt's JVM and launcher options (-javaagent; review 32), mise's file tasks
           # (`mise run`, like a Makefile; review 33)
           ".jvmopts", ".sbtopts", "mise-tasks", ".mise-tasks",
           # review 34: other task runners' spellings, Elixir's, MSBuild's (imported from
           # every parent directory), NuGet's, RuboCop's `require:`, rspec's, Ansible's
           # (vault_password_file runs), build servers' (Metals and IntelliJ start their
           # argv), nextest's setup scripts, Google repo's launcher
           "Justfile", ".justfile", "Taskfile.yaml", "taskfile.yml", "taskfile.yaml", "Taskfile.dist.yml",
           "Taskfile.dist.yaml", "mix.exs", ".formatter.exs", "Directory.Build.props", "Directory.Build.targets",
           "Directory.Packages.props", "nuget.config", "NuGet.Config", ".rubocop.yml", ".rspec-local",
           "ansible.cfg", ".bsp", ".config/nextest.toml", ".repo",
           # review 35: Terraform's lock (the provider binaries it runs are checked against
           # it), uv's own configuration (before pyproject's [tool.uv]), other names of
           # watched build files, pixi's and Hatch's environments' commands
           ".terraform.lock.hcl", "uv.toml", "gems.rb", "rakefile", "Rakefile.rb", "rakefile.rb", "pixi.toml",
           "hatch.toml", "CMakeUserPresets.json", "taskfile.dist.yml", "taskfile.dist.yaml",
           # review 36: SwiftPM's manifest (SourceKit-LSP builds and runs it when the folder
           # is opened), Zig's and Mill's builds
           "Package.swift", "build.zig", "build.mill", "build.sc")
# The same for names of a kind, at the top: JavaScript tools' configuration modules
# (loaded, so run, by the tool: ESLint, Prettier, Babel, Jest, lint-staged, commitlint...).
WATCHED_GLOBS = ("*.config.js", "*.config.cjs", "*.config.mjs", "*.config.ts", "*.config.cts", "*.config.mts",
                 ".*rc", ".*rc.js", ".*rc.cjs", ".*rc.mjs", ".*rc.ts", ".*rc.json", ".*rc.yml", ".*rc.yaml",
                 ".*rc.toml", "*.conf.js", "Gruntfile.*", "gulpfile.*", ".env.*")
# Build entry points watched in every directory below the top too (outside
# node_modules): a module's own `.mvn/jvm.config` or Makefile runs when someone builds
# in that directory.
WATCHED_DEEP = frozenset({".mvn", "mvnw", "pom.xml", "build.gradle", "build.gradle.kts", "settings.gradle",
                          "settings.gradle.kts", "gradle.properties", "gradlew", "package.json", "Makefile",
                          "GNUmakefile", "makefile", "Cargo.toml", "build.rs", "go.mod", "pyproject.toml", "setup.py",
                          "conftest.py", "CLAUDE.md", "AGENTS.md", "pytest.ini", "pytest.toml", ".pytest.ini",
                          "tox.ini", "setup.cfg", ".gitignore", ".gitattributes", "CMakeLists.txt", "meson.build",
                          "build.xml", "build.sbt", "composer.json", "deno.json", "BUILD.bazel", "BUILD",
                          # direnv's load_dotenv reads it in any directory (review 32), sbt's options
                          ".env", ".jvmopts", ".sbtopts", "mise-tasks", ".mise-tasks", "justfile", "Justfile",
                          ".justfile", "Taskfile.yml", "Taskfile.yaml", "mix.exs", "Directory.Build.props",
                          "Directory.Build.targets", "nuget.config", "NuGet.Config", ".rubocop.yml", "ansible.cfg",
                          "Package.swift", "build.zig"})
# Environments the host's tools and editors run from (present_exposed): said wherever
# they are; a Python one by its pyvenv.cfg or conda-meta where the name is common.
ENV_DIRS = frozenset({"node_modules", ".venv", "venv", "env", ".conda",
                      # Terraform's providers: binaries `terraform plan` and its language
                      # server run (review 35)
                      ".terraform"})
# Directories whose every Python environment (its pyvenv.cfg) the host's tools run,
# whatever its name: tox's `.tox/ENV` and nox's `.nox/SESSION` (`tox -e py311` and
# `nox -s tests` on the host reuse them, and editors offer them as interpreters).
ENV_PARENTS = frozenset({".tox", ".nox"})


# Names of a kind protected in every directory below the top too.
DEEP_GLOBS = PROTECTED_GLOBS
_DEEP_GLOBS = re.compile("|".join(fnmatch.translate(g) for g in DEEP_GLOBS))
_NESTED = {d: re.compile("|".join(fnmatch.translate(g) for g in names)) for d, names in NESTED.items()}
# The top's WATCHED_GLOBS (JavaScript tools' configuration modules) below it too:
# editors' extensions load them from every module of a workspace (review 34).
_WATCHED_GLOBS = re.compile("|".join(fnmatch.translate(g) for g in WATCHED_GLOBS))


def deep_name(name: str) -> bool:
    """NAME, in a directory below the project's top, is protected (DEEP, DEEP_GLOBS)."""
    return name in DEEP or _DEEP_GLOBS.match(name) is not None


def top_glob(name: str) -> bool:
    """NAME, at the project's top, is protected by a glob (PROTECTED_GLOBS)."""
    return _DEEP_GLOBS.match(name) is not None


def nested_name(directory: str, name: str) -> bool:
    """NAME, in a directory named DIRECTORY (NESTED) anywhere in the project, is protected."""
    return directory in _NESTED and _NESTED[directory].match(name) is not None


def watched_deep(name: str, in_env: bool = False) -> bool:
    """NAME, below the project's top, is watched (WATCHED_DEEP, and WATCHED_GLOBS outside
    the environments: a package's own `.*rc` there is no project's configuration)."""
    return name in WATCHED_DEEP or not in_env and _WATCHED_GLOBS.match(name) is not None


def protected_parts(parts: list[str]) -> bool:
    """The path PARTS (from the project's top) is or lies in a protected name (a DEEP one
    anywhere below the top, a glob's at the top, a NESTED one anywhere, another version
    control system's settings anywhere: review 35, committed below the top)."""
    return top_glob(parts[0]) or any(deep_name(p) for p in parts[1:]) \
        or any(nested_name(p, q) for p, q in zip(parts, parts[1:])) \
        or any(p in VCS_SETTINGS and any("/".join(parts[i + 1:i + 1 + s.count("/") + 1]) == s
                                         for s in VCS_SETTINGS[p]) for i, p in enumerate(parts))
