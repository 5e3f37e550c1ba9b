"""Deletion and retention: delete a thread or the checkpoints of runs, prune, copy a
thread, and collect the stored values no checkpoint refers to any more.

A layer over :class:`~agentcheck.savers._core.SaverCore`, free of I/O like it: each method
is an operation (see :mod:`agentcheck.backends.base`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from agentcheck.backends.base import OnCommit, Operation, Query, id_text, in_list
from agentcheck.savers._core import _EMPTY, INLINE_KEY, SaverCore, _chunks
from agentcheck.savers._deltas import BASES_KEY, DELTA
from agentcheck.savers._runs import OUTSIDE_EDITS

__all__ = ["RetentionCore"]


def _id_list(ids: Sequence[str], what: str) -> list[str]:
    """The ids of a call that takes several, refusing a lone string: iterated, it would
    name one thread or run per character, and delete those."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(
            f"{what} must be a list of ids, not a single {type(ids).__name__} "
            f"(for one id, pass [{ids!r}])"
        )
    if not isinstance(ids, Iterable):
        raise TypeError(f"{what} must be a list of ids, not {type(ids).__name__}")
    return [id_text(i, f"each of {what}") for i in ids]


class RetentionCore(SaverCore):
    """:class:`SaverCore` with the operations that remove or copy what is stored."""

    # -- deletion and retention -------------------------------------------------------

    @staticmethod
    def _lock_threads(statement: str | None, thread_ids: Sequence[str]) -> Operation[None]:
        """Take a deletion's lock (SQL.LOCK_THREAD_DELETION: the turn to delete in the
        threads; SQL.LOCK_THREAD_VALUES: their values, so that the statements after see
        what the puts under way stored, and later puts wait) on each thread, in the order
        given (sorted: two deletions lock alike). Nothing where writers take turns
        (SQLite: the statement is None)."""
        if statement is not None:
            for thread_id in thread_ids:
                yield Query(statement, (thread_id,), fetch=True)
        return None

    def _delete_thread(self, thread_id: str) -> Operation[None]:
        """Everything of the thread: its checkpoints, values, writes, index terms, and its
        journal (runs, events, ledger steps: tool arguments and results too)."""
        thread_id = id_text(thread_id, "thread_id")
        self.list_deltas.clear_thread(thread_id)
        yield from self._lock_threads(self.sql.LOCK_THREAD_DELETION, [thread_id])
        # The run's row before the values: a put that ends or starts the run updates that
        # row before it locks the values its deltas are built on (its run transition is
        # its statement's main part, which PostgreSQL runs first); locked the other way
        # round, the two would wait for each other.
        rows = yield Query(self.sql.THREAD_RUNS, (thread_id, thread_id), fetch=True)
        runs = sorted({thread_id, *(str(r[0]) for r in rows)})
        for statement in self.sql.DELETE_THREAD_JOURNAL:
            yield Query(statement.format(runs=in_list(len(runs))), tuple(runs))
        yield Query(self.sql.DELETE_THREAD_RUNS, (thread_id,))
        yield from self._lock_threads(self.sql.LOCK_THREAD_VALUES, [thread_id])
        for statement in self.sql.DELETE_THREAD:
            yield Query(statement, (thread_id,))
        yield OnCommit(self._forget_thread(thread_id))
        return None

    def _delete_for_runs(self, run_ids: Sequence[str]) -> Operation[None]:
        terms = [self._term(r) for r in _id_list(run_ids, "run_ids")]
        yield from self._check_index("delete_for_runs would find no checkpoint of those runs")
        doomed: list[tuple[str, str, str]] = []
        for chunk in _chunks(terms):
            rows = yield Query(
                self.sql.SELECT_RUN_CHECKPOINTS.format(runs=in_list(len(chunk))),
                tuple(chunk),
                fetch=True,
            )
            doomed.extend((r[0], r[1], r[2]) for r in rows)
        if not doomed:
            return None
        threads = sorted({t for t, _, _ in doomed})
        yield from self._lock_threads(self.sql.LOCK_THREAD_DELETION, threads)
        yield from self._lock_threads(self.sql.LOCK_THREAD_VALUES, threads)
        for statement in self.sql.DELETE_CHECKPOINT:
            yield Query(statement, doomed, many=True)
        for thread_id in threads:
            self.list_deltas.clear_thread(thread_id)
        deleted: dict[tuple[str, str], set[str]] = {}
        for t, ns, cid in doomed:
            deleted.setdefault((t, ns), set()).add(cid)
        for (thread_id, ns), ids in sorted(deleted.items()):
            yield from self._collect_garbage(thread_id, ns, ids)
        return None

    def _collect_garbage(self, thread_id: str, ns: str, deleted: set[str]) -> Operation[None]:
        """After checkpoints of (thread, namespace) were ``deleted``: the remaining ones
        whose parent that was lose their parent (SQL.CLEAR_PARENT), and the stored values
        none of them refers to are deleted, keeping the snapshots that referenced deltas
        are built on. (A channel's newest snapshot was kept too, for a writer that may
        still be making deltas of it; it kept a deleted run's values, and a namespace's
        whose checkpoints are all gone. A writer whose delta is built on a deleted value
        stores it whole instead, see SaverCore._check_bases; on PostgreSQL the
        deletion's LOCK_THREAD_VALUES holds its check until the deletion is committed.)

        The values are read before the checkpoints: a put another writer commits in
        between (PostgreSQL reads each statement's own snapshot; a put that builds on
        no existing row does not wait for the deletion's locks) then has its checkpoint
        read, and its values are either among those it refers to or not read at all.
        Read the other way round, they were deleted as unused."""
        blob_rows = yield Query(self.sql.SELECT_BLOB_KEYS, (thread_id, ns), fetch=True)
        rows = yield Query(self.sql.SELECT_NS_CHECKPOINTS, (thread_id, ns), fetch=True)
        orphans = [(thread_id, ns, row[0]) for row in rows if row[1] in deleted]
        if orphans:
            yield Query(self.sql.CLEAR_PARENT, orphans, many=True)
        referenced: set[tuple[str, str]] = set()
        for cid, _parent, cp_type, cp_data, _mt, _md in rows:
            rest = self._load_checkpoint(cp_type, cp_data, (thread_id, ns, cid))
            referenced.update((ch, str(v)) for ch, v in rest.get("channel_versions", {}).items())
            for ch, chain in (rest.get(BASES_KEY) or {}).items():
                referenced.update((ch, str(v)) for v in chain)
        deltas = [(ch, v) for ch, v, type_ in blob_rows if type_.startswith(DELTA)]
        needed = [pair for pair in deltas if pair in referenced]
        if needed:
            found = yield from self._fetch_blobs(thread_id, ns, needed)
            referenced.update(found)  # with the snapshots the deltas need
        unused = [(thread_id, ns, ch, v) for ch, v, _type in blob_rows if (ch, v) not in referenced]
        if unused:
            yield Query(self.sql.DELETE_BLOB, unused, many=True)
        return None

    def _copy_thread(self, source_thread_id: str, target_thread_id: str) -> Operation[None]:
        source = id_text(source_thread_id, "source_thread_id")
        target = id_text(target_thread_id, "target_thread_id")
        # A deletion in the source (prune, delete_for_runs) waits until the copy is
        # made: between two of its statements it would leave copied checkpoints without
        # their values (PostgreSQL; SQLite's writers take turns anyway).
        yield from self._lock_threads(self.sql.LOCK_THREAD_DELETION, sorted({source, target}))
        if self.sql.PENDING_TERMS:
            yield Query(self.sql.DELETE_ORPHAN_PENDING_TERMS, (target,))
        for statement in self.sql.COPY_THREAD:
            yield Query(statement, (target, source))
        for statement in self.sql.COPY_THREAD_TERMS:  # after the checkpoints they follow
            yield Query(statement, (target, target, source))
        return None

    def _prune(self, thread_ids: Sequence[str], strategy: str) -> Operation[None]:
        ids = sorted(set(_id_list(thread_ids, "thread_ids")))
        if strategy == "delete":
            for thread_id in ids:
                yield from self._delete_thread(thread_id)
            return None
        if strategy != "keep_latest":
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in ids:
            self.list_deltas.clear_thread(thread_id)
            yield from self._lock_threads(self.sql.LOCK_THREAD_DELETION, [thread_id])
            yield from self._lock_threads(self.sql.LOCK_THREAD_VALUES, [thread_id])
            ns_rows = yield Query(self.sql.SELECT_THREAD_NAMESPACES, (thread_id,), fetch=True)
            for (ns,) in ns_rows:
                yield from self._keep_latest(thread_id, ns)
        return None

    def _keep_latest(self, thread_id: str, ns: str) -> Operation[None]:
        """Keep the newest checkpoint of a namespace, plus, for each DeltaChannel it
        uses, the ancestors back to the one holding that channel's stored seed (without
        them the channel would silently rebuild as empty)."""
        rows = yield Query(self.sql.SELECT_NS_CHECKPOINTS, (thread_id, ns), fetch=True)
        if len(rows) <= 1:
            return None
        by_id = {r[0]: r for r in rows}
        latest = rows[0]
        keep = {latest[0]}
        meta = self._load_metadata(latest[4], latest[5], (thread_id, ns, latest[0]))
        # Newest an edit (update_state) not resumed yet: the checkpoints it was made over,
        # back to the step it edits, stay too, with their writes, so that the resumed
        # tasks still find the ones they go on with (their completed calls replay).
        # Not for an edit of a step the run went on from (a fork, whose calls are new):
        # without the later checkpoints it would look like an edit of a paused step.
        edit, edit_meta, chain = latest, meta, [latest[0]]
        while edit_meta.get("source") in OUTSIDE_EDITS and edit[1] in by_id:
            edit = by_id[edit[1]]
            if edit[0] in chain:  # (a damaged chain that loops)
                break
            chain.append(edit[0])
            edit_meta = self._load_metadata(edit[4], edit[5], (thread_id, ns, edit[0]))
        for ours, parent in zip(chain, chain[1:], strict=False):
            if (yield from self._went_on(thread_id, ns, parent, ours)):
                break  # (as the resume tells a fork: SaverCore._went_on)
        else:
            keep.update(chain)
        delta_channels = set(meta.get("counters_since_delta_snapshot") or {})
        if delta_channels:
            blob_rows = yield Query(self.sql.SELECT_BLOB_KEYS, (thread_id, ns), fetch=True)
            stored = {(ch, v) for ch, v, type_ in blob_rows if type_ != _EMPTY}
            missing = set(delta_channels)
            cursor: tuple[Any, ...] | None = latest
            walked: set[str] = set()
            while cursor is not None and missing:
                if cursor[0] in walked:  # (a damaged chain that loops)
                    break
                walked.add(cursor[0])
                keep.add(cursor[0])
                rest = self._load_checkpoint(cursor[2], cursor[3], (thread_id, ns, cursor[0]))
                versions = rest.get("channel_versions", {})
                inline = rest.get(INLINE_KEY) or {}
                missing = {
                    ch
                    for ch in missing
                    if ch not in inline and (ch, str(versions.get(ch))) not in stored
                }
                cursor = by_id.get(cursor[1]) if cursor[1] else None
        doomed = [(thread_id, ns, cid) for cid in by_id if cid not in keep]
        if doomed:
            for statement in self.sql.DELETE_CHECKPOINT:
                yield Query(statement, doomed, many=True)
            yield from self._collect_garbage(thread_id, ns, {cid for _, _, cid in doomed})
        return None
