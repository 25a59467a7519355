"""`muestra chat` in a pseudo-terminal: answers stream with the history, Ctrl-C stops one answer, Ctrl-D ends."""

from __future__ import annotations

import codecs
import os
import pty
import re
import select
import signal
import sys
import time

from muestra.cli.chat import fit_history
from muestra.v1 import common_pb2, gateway_pb2
from tests.cli.conftest import MUESTRA

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")
PROMPT = "\n> "


class Terminal:
    """A child process on a pseudo-terminal: it has a controlling tty, so ^C and ^D mean what they mean."""

    def __init__(self, argv: list[str], env: dict) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child
            os.execve(sys.executable, argv, env)
        self.seen = ""
        # A character's UTF-8 bytes may arrive in two reads: decode incrementally.
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read_until(self, marker: str, timeout: float = 60) -> str:
        """Everything up to and including `marker` (newlines as "\\n", escapes removed); the rest stays."""
        deadline = time.monotonic() + timeout
        while marker not in self.seen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {marker!r} in {self.seen!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = self.decoder.decode(os.read(self.fd, 4096))
                except OSError:  # the child closed the terminal
                    raise AssertionError(f"ended before {marker!r}: {self.seen!r}") from None
                self.seen = ANSI.sub("", (self.seen + chunk).replace("\r\n", "\n"))
        head, _, self.seen = self.seen.partition(marker)
        return head + marker

    def send(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def wait(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            try:
                os.read(self.fd, 4096)  # keep the terminal drained
            except OSError:
                pass
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError("muestra chat did not exit")


def greedy_answer(stack, conversation: list[tuple[str, str]], max_tokens: int) -> str:
    request = gateway_pb2.GenerateRequest(
        messages=common_pb2.ChatMessages(messages=[common_pb2.ChatMessage(role=r, content=c) for r, c in conversation]),
        max_tokens=max_tokens,
        samplers=[gateway_pb2.SamplerSpec(name="greedy")],
    )
    metadata = [("authorization", f"Bearer {stack.api_key}")]
    messages = stack.stub.Generate(request, timeout=60, metadata=metadata)
    return "".join(m.delta.text for m in messages if m.HasField("delta"))


def answer_to(term: Terminal, line: str) -> str:
    """Send one line; the answer printed before the next prompt."""
    term.send(line + "\n")
    term.read_until(line + "\n")  # the terminal's echo
    return term.read_until(PROMPT)[: -len(PROMPT)]


def test_chat_keeps_the_history_and_survives_ctrl_c(openai_stack):
    env = {**os.environ, "MUESTRA_API_KEY": openai_stack.api_key, "TERM": "dumb"}
    argv = [*MUESTRA, "chat", "--gateway", openai_stack.gateway.address, "--temperature", "0", "--max-tokens", "10"]
    term = Terminal(argv, env)
    banner = term.read_until("> ")
    assert f"muestra chat with {openai_stack.text_model}" in banner

    first = answer_to(term, "Hola")
    # Normalised by the terminal: compare as it shows text (its \r\n are \n again here).
    assert first == greedy_answer(openai_stack, [("user", "Hola")], 10).replace("\r\n", "\n")
    second = answer_to(term, "Y luego?")
    history = [("user", "Hola"), ("assistant", first), ("user", "Y luego?")]
    assert second == greedy_answer(openai_stack, history, 10)
    assert second != greedy_answer(openai_stack, [("user", "Y luego?")], 10)  # the history made the difference

    # Ctrl-C while the answer is being generated (the gateway paused so that it cannot finish first).
    gateway_pid = openai_stack.gateway.proc.pid
    os.kill(gateway_pid, signal.SIGSTOP)
    try:
        term.send("Cuenta hasta diez\n")
        term.read_until("Cuenta hasta diez\n")
        time.sleep(0.5)
        term.send("\x03")
        stopped = term.read_until(PROMPT, timeout=30)
    finally:
        os.kill(gateway_pid, signal.SIGCONT)
    assert "[stopped]" in stopped and "Traceback" not in stopped
    # The chat goes on: the stopped turn stays in the history with what it had shown (nothing here).
    history += [("assistant", second), ("user", "Cuenta hasta diez"), ("assistant", ""), ("user", "Hola")]
    assert answer_to(term, "Hola") == greedy_answer(openai_stack, history, 10)

    term.send("\x04")  # Ctrl-D at an empty prompt
    assert term.wait() == 0
    assert "Traceback" not in term.seen


def test_exit_command_ends_the_chat(openai_stack):
    env = {**os.environ, "MUESTRA_API_KEY": openai_stack.api_key, "TERM": "dumb"}
    term = Terminal([*MUESTRA, "chat", "--gateway", openai_stack.gateway.address], env)
    term.read_until("> ")
    term.send("/exit\n")
    assert term.wait() == 0


def test_twelve_turns_at_the_default_max_tokens_never_fail_on_the_context(openai_stack):
    # The tiny llama's context is 512 tokens and its answers run to the default 256: from the second
    # turn on, the history must be cut for every question to fit.
    env = {**os.environ, "MUESTRA_API_KEY": openai_stack.api_key, "TERM": "dumb"}
    argv = [*MUESTRA, "chat", "--gateway", openai_stack.gateway.address, "--system", "Be brief.", "--temperature", "0"]
    term = Terminal(argv, env)
    banner = term.read_until("> ")
    assert "context 512 tokens" in banner and "/reset" in banner
    shown = ""
    for turn in range(12):
        shown += answer_to(term, f"Pregunta número {turn}?")
    assert "dropped the oldest" in shown and "context of 512 tokens" in shown
    assert "exceeds" not in shown and "INVALID_ARGUMENT" not in shown and "muestra chat:" not in shown

    # /reset: the next answer is the one a fresh conversation (with the system message) gets.
    term.send("/reset\n")
    assert "starts over" in term.read_until(PROMPT)
    answer = answer_to(term, "Hola")
    assert answer == greedy_answer(openai_stack, [("system", "Be brief."), ("user", "Hola")], 256)
    term.send("/exit\n")
    assert term.wait() == 0
    assert "Traceback" not in term.seen


def test_a_message_too_long_for_the_context_is_one_line_and_the_chat_goes_on(openai_stack):
    env = {**os.environ, "MUESTRA_API_KEY": openai_stack.api_key, "TERM": "dumb"}
    argv = [*MUESTRA, "chat", "--gateway", openai_stack.gateway.address, "--max-tokens", "8", "--temperature", "0"]
    term = Terminal(argv, env)
    term.read_until("> ")
    term.send("uno dos tres " * 200 + "\n")  # readline scrolls a line this long: its echo is not read back
    refused = [line for line in term.read_until(PROMPT).splitlines() if line.startswith("muestra chat:")]
    assert len(refused) == 1 and "exceeds the context of 512" in refused[0], refused
    assert answer_to(term, "Hola") == greedy_answer(openai_stack, [("user", "Hola")], 8)
    term.send("\x04")
    assert term.wait() == 0


def test_fit_history_drops_whole_exchanges_from_the_oldest_and_never_the_system_message():
    def count(messages):  # one token per character, a context of 30
        return sum(len(m["content"]) for m in messages), 30

    conversation = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1-long-answer"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"},
    ]
    fit = fit_history(conversation, 10, count)
    assert fit.messages == [conversation[0], *conversation[3:]] and fit.dropped == 2
    assert fit_history(conversation, 1, count).dropped == 0
    too_long = fit_history([conversation[0], {"role": "user", "content": "x" * 40}], 10, count)
    assert too_long.messages is None and too_long.prompt_tokens == 43


def test_an_unknown_command_is_refused_with_the_list_and_never_sent(openai_stack):
    env = {**os.environ, "MUESTRA_API_KEY": openai_stack.api_key, "TERM": "dumb"}
    argv = [*MUESTRA, "chat", "--gateway", openai_stack.gateway.address, "--temperature", "0", "--max-tokens", "8"]
    term = Terminal(argv, env)
    term.read_until("> ")
    refused = answer_to(term, "/nonsense")
    assert "muestra chat: unknown command /nonsense" in refused, refused
    assert all(command in refused for command in ("/reset", "/help", "/exit", "/quit", "//")), refused
    # Nothing went into the history: the next answer is the one a fresh conversation gets.
    assert answer_to(term, "Hola") == greedy_answer(openai_stack, [("user", "Hola")], 8)
    # `//` sends a message that starts with one slash.
    history = [("user", "Hola"), ("assistant", greedy_answer(openai_stack, [("user", "Hola")], 8))]
    assert answer_to(term, "//nonsense") == greedy_answer(openai_stack, [*history, ("user", "/nonsense")], 8)
    term.send("/exit\n")
    assert term.wait() == 0
    assert "Traceback" not in term.seen
