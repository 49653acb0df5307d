"""What a run records about itself: versions, git commit, machine, redacted config."""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any


REDACTED = "***"
#: words that make a name secret (the name is split at _ - . / and camelCase)
_SECRET_WORDS = {"secret", "secrets", "token", "tokens", "password", "passwd", "passphrase", "pwd", "pass",
                 "apikey", "credential", "credentials", "bearer", "key", "auth", "authorization", "cookie",
                 "signature", "privatekey", "accesskey"}
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/\s:@]*):(?P<password>[^/\s@]*)@")
_FLAG = re.compile(r"^(?P<flag>--?[A-Za-z0-9_.-]+)=(?P<value>.*)$", re.S)


def is_secret_name(name: Any) -> bool:
    """A name (config key, variable, flag) that holds a secret: api_key, WANDB_API_KEY, hfToken,
    --api-key, db.password, pwd, ... but not author, keys_seen or monkey."""
    words = [w.lower() for w in _WORD.findall(str(name))]
    joined = "".join(words)
    return any(w in _SECRET_WORDS for w in words) or any(
        s in joined for s in ("apikey", "accesskey", "privatekey", "secretkey", "password", "passphrase"))


#: a flag and its value in running text: ``--api-key VALUE``, ``--token=VALUE``, ``-p 'VALUE'``
_TEXT_FLAG = re.compile(r"(?P<flag>(?<![\w-])--?[A-Za-z][\w.-]*)(?P<sep>=|[ \t]+)"
                        r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\"]+)")


#: a flag and its value in a printed list (``sys.argv``): ``'--hf-token', 'VALUE'``
_LISTED_FLAG = re.compile(r"(?P<flag>(?P<q>['\"])--?[A-Za-z][\w.-]*(?P=q),\s*)(?P<v>['\"])(?P<value>.*?)(?P=v)")
#: an assignment in running text: ``db.password=VALUE``, ``NAME_TOKEN=VALUE`` (a Hydra override, a shell line)
_ASSIGNED = re.compile(r"(?P<key>(?<![\w.-])[A-Za-z_][\w.-]*)=(?P<value>'[^']*'|\"[^\"]*\"|[^\s'\",;]+)")
#: an HTTP authorization header's credentials
_BEARER = re.compile(r"(?i)\b(?P<scheme>bearer|basic|token)\s+(?P<value>[A-Za-z0-9._~+/=-]{8,})")
#: a secret's value shorter than this is not looked for in text ("1", "yes" would redact everything)
MIN_SECRET_CHARS = 6


#: variables whose names look secret but are not (the shell's working directories: "pwd")
_NOT_SECRET_VARIABLES = frozenset({"PWD", "OLDPWD"})


def secret_values(env: Mapping[str, str]) -> list[str]:
    """The values of the variables whose names mark them secret (``HF_TOKEN``, ``MY_API_TOKEN``), longest
    first: wherever they appear in text, they are known to be secrets. A path is not looked for (a
    ``*_KEY_FILE`` names where a secret is, and every message naming a file under it would lose it)."""
    found = {v for k, v in env.items() if is_secret_name(k) and k not in _NOT_SECRET_VARIABLES
             and isinstance(v, str) and len(v) >= MIN_SECRET_CHARS and not v.startswith(("/", "~", "."))}
    return sorted(found, key=len, reverse=True)


#: a secret's first characters that, shown alone (``sk-live-12...``, as "invalid key" messages cut it), are redacted
TRUNCATED_CHARS = 8
#: credentials recognisable by their shape, whoever holds them: OpenAI/Anthropic-style ``sk-``, Hugging Face
#: ``hf_``, GitHub ``ghp_``..., Slack ``xox?-``, AWS access key ids, JWTs
_SHAPES = re.compile(r"(?<![\w-])(?:sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{16,}|"
                     r"xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,})")


def argument_secrets(fn: Any, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str]:
    """The string values of a call's arguments that are secrets by their name: a parameter named as one
    (``api_key``, ``hf_token``), an entry of a mapping (at any depth) whose key is."""
    import inspect

    try:
        named = dict(inspect.signature(fn).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        named = dict(kwargs)
    found: list[str] = []

    def walk(name: Any, value: Any) -> None:
        if isinstance(value, str):
            if is_secret_name(name):
                found.append(value)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                walk(key, item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(name, item)

    for name, value in named.items():
        walk(name, value)
    return found


def _without_secret(text: str, secret: str) -> str:
    """``text`` without ``secret``, whole or cut short: its first TRUNCATED_CHARS characters or more where
    an ellipsis or ``*`` follows them (``sk-live-12...``), or 12 or more (a word it starts with stays)."""
    text = text.replace(secret, REDACTED)
    if len(secret) < TRUNCATED_CHARS + 2:
        return text
    head, start = secret[:TRUNCATED_CHARS], 0
    while (i := text.find(head, start)) >= 0:
        n = TRUNCATED_CHARS
        while i + n < len(text) and n < len(secret) and text[i + n] == secret[n]:
            n += 1
        if n >= 12 or text.startswith(("...", "…", "*"), i + n):
            text = text[:i] + REDACTED + text[i + n:]
        start = i + 1
    return text


def redact_text(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with every known secret value (``secrets``, also cut short: ``sk-live-12...``: the shell's, a
    stage's ``env=``, the workflow's stages' arguments named as secrets), credentials by their shape (``hf_...``, ``sk-...``), passwords in
    URLs (scheme://user:PASSWORD@host), the values of secret flags (``--api-key X``, ``--token=X``,
    ``'--hf-token', 'X'`` in a printed argv), of secret assignments (``db.password=X``, ``NAME_TOKEN=X``)
    and of ``Bearer X`` replaced by ***."""
    for value in sorted(set(secrets), key=len, reverse=True):
        text = _without_secret(text, value)
    text = _SHAPES.sub(REDACTED, text)
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    text = _LISTED_FLAG.sub(lambda m: f"{m['flag']}{m['v']}{REDACTED}{m['v']}"
                            if is_secret_name(m["flag"].strip("'\", ")) else m[0], text)
    text = _TEXT_FLAG.sub(lambda m: f"{m['flag']}{m['sep']}{REDACTED}" if is_secret_name(m["flag"]) else m[0], text)
    text = _ASSIGNED.sub(lambda m: f"{m['key']}={REDACTED}" if is_secret_name(m["key"]) else m[0], text)
    return _BEARER.sub(lambda m: f"{m['scheme']} {REDACTED}", text)


def redact(value: Any) -> Any:
    """A copy of ``value`` with secrets replaced by ***: entries whose key names a secret,
    the value after a secret flag in an argument list (``["--api-key", X]``, ``--token=X``),
    and passwords inside URLs. The one redaction for logs, errors, history attributes,
    reports and ``sites show``."""
    if isinstance(value, Mapping):
        return {k: REDACTED if is_secret_name(k) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        hide_next = False
        for item in value:
            if hide_next:
                out.append(REDACTED)
                hide_next = False
            elif isinstance(item, str) and (m := _FLAG.match(item)) and is_secret_name(m["flag"]):
                out.append(f"{m['flag']}={REDACTED}")
            else:
                hide_next = isinstance(item, str) and item.startswith("-") and is_secret_name(item)
                out.append(redact(item))
        return out
    if isinstance(value, str):
        return redact_text(value, secret_values(os.environ))
    return value


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` (None: not installed)."""
    import importlib.metadata  # ~20 ms: only when asked

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str]:
    dists = ("parsl-torch", "torch", "numpy", "h5py", "mpi4py", "parsl", "wandb", "globus-compute-sdk")
    return {"python": sys.version.split()[0], **{d: v for d in dists if (v := installed_version(d)) is not None}}


def git_commit(env: Mapping[str, str] | None = None) -> str:
    """HEAD of the git repository around the current directory, or ''; ``env``: git's environment (a rank's
    without its observer: ``observe.native.without_observer``)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             env=dict(os.environ if env is None else env))
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""
