"""The prompts dsv41.client.bench sends: unique random-word prompts of a given token count (fitted to
the server's tokenizer when it has a tokenize endpoint), the fixed prose and code requests of the decode
steps, and long real text with a code hidden in the middle for the long-context step."""
import ast
import functools
import sysconfig
import uuid
from pathlib import Path

from dsv41.client.api import RunDeadline, TimedOut
from dsv41.errors import UserError

WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name president team minute idea kid body information back parent face others level "
         "office door health person art war history party result change morning reason research girl guy "
         "moment air teacher force education river stone garden bridge window paper light green quiet").split()
PROMPTS = {
    "prose": ["Write a story of about 400 words about a lighthouse keeper who finds a message in a bottle.",
              "Write an essay of about 400 words on why cities grow near rivers.",
              "Write a story of about 400 words about a train that runs one hour late every day.",
              "Describe, in about 400 words, a walk through a market at dawn."],
    "code": ["Write a Python module with an LRU cache class (get, put, capacity) and pytest tests for it.",
             "Write a Python function that parses an INI file into nested dicts, with docstrings and tests.",
             "Write a Python command-line tool that counts word frequencies in files, with argparse.",
             "Write a Python class implementing a binary heap priority queue, with unit tests."],
    # a quick check of the decode path: short natural answers
    "short": ["In one sentence, what is a lighthouse?", "In one sentence, why is the sky blue?",
              "In one sentence, what does a compiler do?", "In one sentence, what is a river delta?"],
}
CHARS_PER_TOKEN = 4.0
TOKENS_PER_WORD = 1.3


class Tokens:
    """Prompt token counting: the server's tokenize endpoint when there is one, else an estimate."""

    def __init__(self, client, model):
        self.client, self.model, self.how = client, model, None

    def count(self, text):
        tries = [("/tokenize", {"model": self.model, "prompt": text}, "count"),  # vLLM
                 ("/extras/tokenize/count", {"input": text}, "count")]  # llama-cpp-python
        if self.how is False:
            return None
        for path, body, key in tries:
            if self.how not in (None, path):
                continue
            try:          # within the client's deadline (--request-timeout-s), as every call
                r = self.client.post_json(path, body, root=True)
                if isinstance(r.get(key), int):
                    self.how = path
                    return r[key]
            except RunDeadline:
                raise
            except TimedOut:
                raise TimedOut(f"{path} got no answer within {self.client.read_timeout:g} s "
                               "(--request-timeout-s): the server is stuck or slower than that") from None
            except UserError:  # no usable tokenize endpoint
                pass
        self.how = False
        return None


def random_prompt(tokens, target, rng):
    """Unique random-word text of about `target` tokens (fitted to the server's tokenizer if any)."""
    head = f"{uuid.uuid4().hex} "  # unique first tokens defeat prefix caches
    words = max(1, round(target / TOKENS_PER_WORD))
    for _ in range(3):
        prompt = head + " ".join(rng.choice(WORDS) for _ in range(words))
        n = tokens.count(prompt)
        if not n or abs(n - target) <= max(2, target * 0.02):
            break
        words = max(1, round(words * target / n))
    return prompt


@functools.lru_cache(maxsize=4)
def real_text(chars):
    """Real prose that ships on the machine: licence texts, then standard-library docstrings."""
    out, total, seen = [], 0, set()
    lic = Path("/usr/share/common-licenses")
    files = sorted(lic.iterdir()) if lic.is_dir() else []
    for f in files:
        real = f.resolve()
        if real in seen or not real.is_file():
            continue
        seen.add(real)
        out.append(real.read_text(errors="replace"))
        total += len(out[-1])
        if total >= chars:
            return "\n\n".join(out)[:chars]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for f in sorted(stdlib.rglob("*.py")):
        if "test" in f.parts or "site-packages" in f.parts:
            continue
        try:
            tree = ast.parse(f.read_text(errors="replace"))
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    out.append(doc)
                    total += len(doc)
        if total >= chars:
            break
    text = "\n\n".join(out)
    if len(text) < chars:
        raise UserError(f"not enough local text for a {chars}-character context: lower --ctx")
    return text[:chars]


def ctx_prompt(tokens, target, rng):
    """Real text of about `target` tokens with a code hidden in the middle, and a question about it."""
    code = str(rng.randint(100000, 999999))
    question = "\n\nWhat is the vault code stated in the text above? Reply with the number."
    chars = int(target * CHARS_PER_TOKEN)
    for _ in range(3):  # fit to the server's tokenizer when it has a tokenize endpoint
        text = real_text(chars)
        mid = len(text) // 2
        prompt = (f"{uuid.uuid4().hex}\n" + text[:mid] + f"\n\nThe vault code is {code}.\n\n" + text[mid:]
                  + question)
        n = tokens.count(prompt)
        if not n or abs(n - target) <= max(16, target * 0.01):
            break
        chars = int(chars * target / n)
    return prompt, code, n
