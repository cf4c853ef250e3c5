"""The training corpus: pinned packages from registries reachable here (PyPI, npm, Debian), by language.

Why pinned and registry-only: the model must be rebuildable bit for bit on a machine that reaches
package registries and nothing else. Every repository of every evaluation set is left out
(`EXCLUDED`, checked by tests/test_training_sources.py), so the evaluation stays held out.
"""

from __future__ import annotations

from pathlib import Path

from bench.languages import LANGUAGES, REFERENCE, Corpus, fetch

ROOT = Path(__file__).resolve().parent.parent
CORPUS_DIR = ROOT / "training" / "corpus"  # gitignored: fetched, never committed

#: Projects the evaluation sets are written on (bench/eval-*.json, shared/eval/fastapi.json), plus the
#: benchmark corpus (Django) and this project: none of their code may be trained on.
EXCLUDED = frozenset({c.repo for c in LANGUAGES + REFERENCE} | {"django", "moonmind", "moonmind-worker"})


def _c(repo: str, language: str, registry: str, spec: str, root: str = "") -> Corpus:
    return Corpus(repo, language, registry, spec, root, Path())


SOURCES: tuple[Corpus, ...] = (
    # Python: well-documented libraries (docstrings) of different domains
    _c("flask", "Python", "pypi-wheel", "flask==3.1.0"),
    _c("werkzeug", "Python", "pypi-wheel", "werkzeug==3.1.3"),
    _c("jinja2", "Python", "pypi-wheel", "jinja2==3.1.4"),
    _c("marshmallow", "Python", "pypi-wheel", "marshmallow==3.23.1"),
    _c("more-itertools", "Python", "pypi-wheel", "more-itertools==10.5.0"),
    _c("rich", "Python", "pypi-wheel", "rich==13.9.4"),
    _c("tornado", "Python", "pypi-wheel", "tornado==6.4.2"),
    _c("networkx", "Python", "pypi-wheel", "networkx==3.4.2"),
    _c("boltons", "Python", "pypi-wheel", "boltons==24.1.0"),
    _c("toolz", "Python", "pypi-wheel", "toolz==1.0.0"),
    _c("arrow", "Python", "pypi-wheel", "arrow==1.3.0"),
    _c("pluggy", "Python", "pypi-wheel", "pluggy==1.5.0"),
    _c("pytest", "Python", "pypi-wheel", "pytest==8.3.4"),
    _c("paramiko", "Python", "pypi-wheel", "paramiko==3.5.0"),
    _c("scrapy", "Python", "pypi-wheel", "scrapy==2.12.0"),
    _c("sqlalchemy", "Python", "pypi-wheel", "sqlalchemy==2.0.36"),
    # JavaScript / TypeScript: packages that ship their source (JSDoc, TSDoc)
    _c("lodash", "JavaScript", "npm", "lodash@4.17.21", "package"),
    _c("async", "JavaScript", "npm", "async@3.2.6", "package"),
    _c("commander", "JavaScript", "npm", "commander@12.1.0", "package"),
    _c("yargs", "JavaScript", "npm", "yargs@17.7.2", "package"),
    _c("moment", "JavaScript", "npm", "moment@2.30.1", "package/src"),
    _c("bluebird", "JavaScript", "npm", "bluebird@3.7.2", "package/js/release"),
    _c("koa", "JavaScript", "npm", "koa@2.15.3", "package/lib"),
    _c("fastify", "JavaScript", "npm", "fastify@5.1.0", "package/lib"),
    _c("ws", "JavaScript", "npm", "ws@8.18.0", "package/lib"),
    _c("ajv", "TypeScript", "npm", "ajv@8.17.1", "package/lib"),
    _c("mobx", "TypeScript", "npm", "mobx@6.13.5", "package/src"),
    _c("zod", "TypeScript", "npm", "zod@3.23.8", "package"),
    _c("fp-ts", "TypeScript", "npm", "fp-ts@2.16.9", "package"),
    _c("inversify", "TypeScript", "npm", "inversify@6.1.5", "package/lib"),
    _c("date-fns", "TypeScript", "npm", "date-fns@4.1.0", "package"),
    _c("redux", "TypeScript", "npm", "redux@5.0.1", "package/src"),
    _c("luxon", "JavaScript", "npm", "luxon@3.7.2", "package/src"),
    _c("mongoose", "JavaScript", "npm", "mongoose@9.12.1", "package/lib"),
    _c("eslint", "JavaScript", "npm", "eslint@10.15.0", "package/lib"),
    _c("webpack", "JavaScript", "npm", "webpack@5.112.2", "package/lib"),
    _c("knex", "JavaScript", "npm", "knex@3.3.0", "package/lib"),
    _c("winston", "JavaScript", "npm", "winston@3.19.0", "package/lib"),
    _c("handlebars", "JavaScript", "npm", "handlebars@4.7.10", "package/lib"),
    _c("three", "JavaScript", "npm", "three@0.187.0", "package/src"),
    _c("effect", "TypeScript", "npm", "effect@4.1.0", "package/src"),
    _c("query-core", "TypeScript", "npm", "@tanstack/query-core@5.108.0", "package/src"),
    _c("redux-toolkit", "TypeScript", "npm", "@reduxjs/toolkit@2.14.0", "package/src"),
    # Go
    _c("go-std", "Go", "deb", "golang-1.19-src=1.19.8-2", "usr/share/go-1.19/src"),
    _c("mux", "Go", "deb", "golang-github-gorilla-mux-dev=1.8.0-1"),
    _c("logrus", "Go", "deb", "golang-github-sirupsen-logrus-dev=1.9.0-1"),
    _c("testify", "Go", "deb", "golang-github-stretchr-testify-dev=1.8.1-1"),
    _c("viper", "Go", "deb", "golang-github-spf13-viper-dev=1.10.1-1"),
    _c("pflag", "Go", "deb", "golang-github-spf13-pflag-dev=1.0.6~git20210604-d5e0c0615ace-1"),
    _c("gin", "Go", "deb", "golang-github-gin-gonic-gin-dev=1.8.1-1"),
    _c("urfave-cli", "Go", "deb", "golang-github-urfave-cli-dev=1.22.9-2"),
    _c("go-cmp", "Go", "deb", "golang-github-google-go-cmp-dev=0.5.9-1"),
    _c("yaml.v3", "Go", "deb", "golang-gopkg-yaml.v3-dev=3.0.1-3"),
    _c("prometheus-client", "Go", "deb", "golang-github-prometheus-client-golang-dev=1.14.0-3"),
    # Rust
    _c("regex", "Rust", "deb", "librust-regex-dev=1.7.1-1"),
    _c("serde", "Rust", "deb", "librust-serde-dev=1.0.152-2"),
    _c("clap", "Rust", "deb", "librust-clap-dev=4.0.32-1"),
    _c("rand", "Rust", "deb", "librust-rand-dev=0.8.5-1"),
    _c("itertools", "Rust", "deb", "librust-itertools-dev=0.10.3-1"),
    _c("anyhow", "Rust", "deb", "librust-anyhow-dev=1.0.69-1"),
    _c("log", "Rust", "deb", "librust-log-dev=0.4.17-3"),
    _c("bytes", "Rust", "deb", "librust-bytes-dev=1.2.1-1"),
    _c("hashbrown", "Rust", "deb", "librust-hashbrown-dev=0.12.3-1"),
    _c("indexmap", "Rust", "deb", "librust-indexmap-dev=1.9.2-1"),
    _c("chrono", "Rust", "deb", "librust-chrono-dev=0.4.23-2"),
    _c("url", "Rust", "deb", "librust-url-dev=2.3.1-1"),
    _c("hyper", "Rust", "deb", "librust-hyper-dev=0.14.19-1"),
    _c("futures-util", "Rust", "deb", "librust-futures-util-dev=0.3.21-1"),
    _c("tokio", "Rust", "deb", "librust-tokio-dev=1.24.2-1"),
    # Ruby
    _c("sinatra", "Ruby", "deb", "ruby-sinatra=3.0.5-3+deb12u1"),
    _c("thor", "Ruby", "deb", "ruby-thor=1.2.1-2"),
    _c("rspec-core", "Ruby", "deb", "ruby-rspec-core=3.12.0c0e1m1s0-1"),
    _c("addressable", "Ruby", "deb", "ruby-addressable=2.8.1-1"),
    _c("i18n", "Ruby", "deb", "ruby-i18n=1.10.0-2"),
    _c("mustermann", "Ruby", "deb", "ruby-mustermann=3.0.0-2"),
    _c("concurrent-ruby", "Ruby", "deb", "ruby-concurrent=1.1.6+dfsg-5"),
    _c("activesupport", "Ruby", "deb", "ruby-activesupport=2:6.1.7.10+dfsg-1~deb12u4"),
    _c("httparty", "Ruby", "deb", "ruby-httparty=0.21.0-1"),
    _c("mime-types", "Ruby", "deb", "ruby-mime-types=3.4.1-2"),
    _c("actionpack", "Ruby", "deb", "ruby-actionpack=2:6.1.7.10+dfsg-1~deb12u4"),
    _c("activerecord", "Ruby", "deb", "ruby-activerecord=2:6.1.7.10+dfsg-1~deb12u4"),
    _c("sequel", "Ruby", "deb", "ruby-sequel=5.63.0-1"),
    _c("puma", "Ruby", "deb", "puma=5.6.5-3+deb12u2"),
    _c("rspec-expectations", "Ruby", "deb", "ruby-rspec-expectations=3.12.0c0e1m1s0-1"),
    _c("redis-rb", "Ruby", "deb", "ruby-redis=4.8.0-1"),
    _c("grape", "Ruby", "deb", "ruby-grape=1.6.2-3"),
    # PHP
    _c("symfony-console", "PHP", "deb", "php-symfony-console=5.4.53+dfsg-0+deb12u1"),
    _c("symfony-http-foundation", "PHP", "deb", "php-symfony-http-foundation=5.4.53+dfsg-0+deb12u1"),
    _c("symfony-routing", "PHP", "deb", "php-symfony-routing=5.4.53+dfsg-0+deb12u1"),
    _c("symfony-yaml", "PHP", "deb", "php-symfony-yaml=5.4.53+dfsg-0+deb12u1"),
    _c("commonmark", "PHP", "deb", "php-league-commonmark=2.3.9-1+deb12u1"),
    _c("carbon", "PHP", "deb", "php-nesbot-carbon=2.65.0-1+deb12u1"),
    _c("twig", "PHP", "deb", "php-twig=3.5.1-1+deb12u3"),
    _c("doctrine-dbal", "PHP", "deb", "php-doctrine-dbal=3.6.1+dfsg-1"),
    _c("phpseclib", "PHP", "deb", "php-phpseclib3=3.0.19-1+deb12u6"),
    _c("symfony-dependency-injection", "PHP", "deb", "php-symfony-dependency-injection=5.4.53+dfsg-0+deb12u1"),
    _c("symfony-validator", "PHP", "deb", "php-symfony-validator=5.4.53+dfsg-0+deb12u1"),
    _c("symfony-http-kernel", "PHP", "deb", "php-symfony-http-kernel=5.4.53+dfsg-0+deb12u1"),
    _c("symfony-cache", "PHP", "deb", "php-symfony-cache=5.4.53+dfsg-0+deb12u1"),
    _c("laravel", "PHP", "deb", "php-laravel-framework=8.83.26+dfsg-2"),
    _c("composer", "PHP", "deb", "composer=2.5.5-1+deb12u5"),
    # C++ (headers carry the documentation)
    _c("fmt", "C++", "deb", "libfmt-dev=9.1.0+ds1-2", "usr/include"),
    _c("googletest", "C++", "deb", "libgtest-dev=1.12.1-0.2", "usr/include"),
    _c("rapidjson", "C++", "deb", "rapidjson-dev=1.1.0+dfsg2-7.1", "usr/include"),
    _c("cxxopts", "C++", "deb", "libcxxopts-dev=3.1.1-1", "usr/include"),
    _c("yaml-cpp", "C++", "deb", "libyaml-cpp-dev=0.7.0+dfsg-8+b1", "usr/include"),
    _c("pugixml", "C++", "deb", "libpugixml-dev=1.13-0.2", "usr/include"),
    _c("tinyxml2", "C++", "deb", "libtinyxml2-dev=9.0.0+dfsg-3.1", "usr/include"),
    _c("glm", "C++", "deb", "libglm-dev=0.9.9.8+ds-6", "usr/include"),
    _c("abseil", "C++", "deb", "libabsl-dev=20220623.1-1+deb12u2", "usr/include"),
    _c("catch2", "C++", "deb", "catch2=2.13.10-1", "usr/include"),
    _c("cli11", "C++", "deb", "libcli11-dev=2.1.2+ds-1", "usr/include"),
    _c("eigen", "C++", "deb", "libeigen3-dev=3.4.0-4", "usr/include"),
)


def fetch_all(say=print) -> list[tuple[Corpus, Path]]:
    """Every source unpacked under training/corpus/<repo> (once), with the folder that is read."""
    out = []
    for c in SOURCES:
        try:
            out.append((c, fetch(c, base=CORPUS_DIR)))
        except Exception as exc:  # a registry hiccup loses one source, not the build: it is reported
            say(f"skipped {c.spec}: {exc}")
    return out
