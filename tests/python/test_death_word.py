"""The death word from Python (wsup_client.arm_death_word): armed in a real
child process from the page a supervisor would pass, marked by the kernel
when that process is killed; an unset variable is nothing to do, a bad one
an error naming it."""

import os
import signal
import subprocess
import sys

import wsup_client as wc

CLIENT = os.path.join(os.path.dirname(os.path.abspath(wc.__file__)), "..")


def page():
    """A fresh page as the supervisor makes it (wire/death_word.h)."""
    return wc.make_death_word("test-death-word")


def child(code, env_value, pass_fds=()):
    env = dict(os.environ, PYTHONPATH=CLIENT)
    env.pop("WSUP_DEATH_FD", None)
    if env_value is not None:
        env["WSUP_DEATH_FD"] = env_value
    return subprocess.Popen([sys.executable, "-c", code], env=env, pass_fds=pass_fds, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


ARM_AND_WAIT = """
import wsup_client
print(wsup_client.arm_death_word(), flush=True)
import time; time.sleep(60)
"""

ARM_AND_REPORT = """
import wsup_client
try:
    print(wsup_client.arm_death_word())
except wsup_client.WsupError as e:
    print("error", e.code_name, e)
"""


def test_an_armed_engine_killed_has_its_word_marked():
    fd = page()
    try:
        p = child(ARM_AND_WAIT, str(fd), pass_fds=(fd,))
        assert p.stdout.readline().strip() == "True", p.stderr.read()
        word, pid = wc.read_death_word(fd)
        assert word != 0 and pid == p.pid
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        word, _ = wc.read_death_word(fd)
        assert word & wc.FUTEX_OWNER_DIED
    finally:
        os.close(fd)


def test_unset_is_nothing_to_do_and_a_bad_value_is_named():
    out, _ = child(ARM_AND_REPORT, None).communicate(timeout=60)
    assert out.strip() == "False"
    out, _ = child(ARM_AND_REPORT, "twelve").communicate(timeout=60)
    assert out.startswith("error invalid_argument") and "WSUP_DEATH_FD='twelve'" in out, out
    out, _ = child(ARM_AND_REPORT, "999999").communicate(timeout=60)
    assert out.startswith("error invalid_argument") and "names no open file" in out, out


def test_a_page_that_is_not_a_death_word_is_refused():
    fd = os.memfd_create("not-a-death-word")
    try:
        os.ftruncate(fd, 4096)
        out, _ = child(ARM_AND_REPORT, str(fd), pass_fds=(fd,)).communicate(timeout=60)
        assert out.startswith("error invalid_argument") and "not a death word" in out, out
        assert wc.read_death_word(fd)[0] == 0
    finally:
        os.close(fd)
