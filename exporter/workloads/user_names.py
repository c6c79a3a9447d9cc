"""uid -> user name for the Slurm job series, looked up off the poll thread."""

from __future__ import annotations

import pwd
import queue
import threading

from gpu_triage.exporter.worker import Worker


class UserNames:
    """uid -> user name, looked up off the poll thread: with LDAP behind NSS, a lookup can hang for minutes.

    A new uid's lookup is waited for briefly (`wait` seconds: local files and a working NSS cache answer in
    far less); one that takes longer answers the uid itself until the name is known.
    """

    def __init__(self, limit: int = 1024, wait: float = 0.05) -> None:
        self._names: dict[int, str] = {}
        self._asked: set[int] = set()
        self._queue: queue.SimpleQueue[tuple[int, threading.Event]] = queue.SimpleQueue()
        self._limit = limit  # distinct users asked about: bounded, as every input
        self._wait = wait
        self._lock = threading.Lock()
        self._worker = Worker("user-names", self._resolve, retry=1.0)  # started at the first new uid

    def name(self, uid: int) -> str:
        with self._lock:
            known = self._names.get(uid)
            if known is not None:
                return known
            if uid in self._asked or len(self._asked) >= self._limit:
                return str(uid)
            self._asked.add(uid)
            done = threading.Event()
            self._queue.put((uid, done))
            if not self._worker.started:
                self._worker.start()
        done.wait(self._wait)
        with self._lock:
            return self._names.get(uid, str(uid))

    def _resolve(self) -> None:
        uid, done = self._queue.get()
        try:
            name = pwd.getpwuid(uid).pw_name
        except (KeyError, OSError):  # no such user here (a container without the cluster's NSS): keep the uid
            name = str(uid)
        with self._lock:
            self._names[uid] = name
        done.set()
