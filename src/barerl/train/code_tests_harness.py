"""Runs a solution's hidden tests inside the sandbox, as its main.py (stdlib only; never imported).

stdin: a JSON object {"nonce": str, "tests": [str, ...], "seconds": float}. The solution (solution.py
beside this file) is executed first, then each test (Python source, e.g. an assert) in a copy of the
solution's namespace, each within `seconds` (SIGALRM). After the solution and after every test, one line
`<nonce>{"passed": n, "done": k}` is printed, so a run cut short still tells how far it got. The nonce
is read before any of the solution's code runs: a solution printing a forged report line would need it.
"""

import json
import signal
import sys

spec = json.loads(sys.stdin.read())
nonce = spec.pop("nonce")


def report(passed: int, done: int, error: str | None = None) -> None:
    print(f"\n{nonce}{json.dumps({'passed': passed, 'done': done, 'error': error})}", flush=True)


def timed_out(*_):
    raise TimeoutError(f"took longer than {spec['seconds']}s")


def run(source: str, namespace: dict, name: str) -> None:
    signal.setitimer(signal.ITIMER_REAL, spec["seconds"])
    try:
        exec(compile(source, name, "exec"), namespace)  # noqa: S102 -- running it is the point, in the sandbox
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


signal.signal(signal.SIGALRM, timed_out)
solution = {"__name__": "solution"}
try:
    with open("solution.py") as f:
        run(f.read(), solution, "solution.py")
except BaseException as e:  # noqa: BLE001 -- the solution's failure is the result
    report(0, 0, f"{type(e).__name__}: {e}")
    raise SystemExit(0) from None
passed = 0
for index, test in enumerate(spec["tests"]):
    try:
        run(test, dict(solution), f"test_{index}")
        passed += 1
    except BaseException:  # noqa: BLE001, S110 -- a failed test is counted, whatever it raised
        pass
    report(passed, index + 1)
