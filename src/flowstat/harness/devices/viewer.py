"""Viewer process (thesis section 3.1.3): receives merged objects and shows what was merged.

It keeps the latest object of each name from each merger and writes, every few seconds and at the
end, their sum over mergers (the whole picture of one cycle) to a ROOT file. It also checks every
object it receives: its cells must add up to the entries its inputs declared.

A topology may make it dear (merge_cost.nodes.viewer): it then spends that CPU time on each object
it takes, in its handling of the object, so that it takes at most 1 / per_object objects/s on any
machine; the wait it causes is in the input latency of the objects behind.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import zmq

from flowstat.node.latency import CHUNK, LatencyRecorder
from flowstat.node.phases import BUSY

from .. import wire
from ..mergecost import node_cost
from ..qcobjects import ObjectDesc, entries_of, merge
from ..rootio import write_objects
from .device import Device

log = logging.getLogger("flowstat.viewer")

TURN_S = 0.01  # a dear viewer reads at most this much added cost at once: then the control socket gets its turn


class Viewer(Device):
    role = "viewer"

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.n_mergers: int = config["mergers"]
        self.receive_buffer_size: int = config.get("buffer_size", 1000)
        self.data = self.ctx.socket(zmq.PULL)
        self.data.setsockopt(zmq.RCVHWM, self.receive_buffer_size)
        self.secure_data(self.data, bound=True)
        self.data_endpoint = self.bind(self.data, config.get("data_port", 0))
        self.output = config.get("output")
        self.write_interval: float = config.get("write_interval", 5.0)
        self.cost = node_cost(config.get("merge_cost"))  # CPU time added per object taken
        self.latest: dict[tuple[bytes, int], tuple[ObjectDesc, np.ndarray, float]] = {}
        self.descs: dict[bytes, ObjectDesc] = {}
        self.expected = [0] * self.n_mergers
        self.eos = [False] * self.n_mergers
        self.objects_received = 0
        self.bytes_received = 0
        self.inputs_received = 0  # raw producer objects inside the merged ones
        self.entries_received = 0.0
        self.content_mismatches = 0
        self.sequence_gaps = 0
        self.malformed = 0
        self.files_written = 0
        self.write_errors = 0
        self.latency: LatencyRecorder = LatencyRecorder()  # of merged objects: from their merger's send to here
        self.sent_stamps: list[float] = []
        self.next_write: float  # when to write the objects out next (monotonic): set as run() starts

    def counters(self) -> dict[str, Any]:
        return {
            "objects_received": self.objects_received,
            "bytes_received": self.bytes_received,
            "inputs_received": self.inputs_received,
            "entries_received": self.entries_received,
            "content_mismatches": self.content_mismatches,
            "sequence_gaps": self.sequence_gaps,
            "malformed_messages": self.malformed,
            "files_written": self.files_written,
            "eos_received": sum(self.eos),
        }

    def on_message(self, frames: list) -> None:
        """One merged object (``frames``: its frames, bytes or buffers)."""
        t0 = time.perf_counter_ns()
        try:
            h = wire.decode_header(frames[0])
            if not 0 <= h.source < self.n_mergers:
                raise wire.WireError(f"unknown merger index {h.source}")
            if h.flags & wire.FLAG_EOS:
                self.eos[h.source] = True
                return
            desc = self.descs.get(h.desc_key) or self.descs.setdefault(h.desc_key, wire.parse_descriptor(h.desc_key))
            data = wire.payload_array(desc, h, frames)
        except (wire.WireError, ValueError) as exc:
            self.malformed += 1
            log.error("%s: dropped malformed message: %s", self.node_id, exc)
            return
        if h.seq != self.expected[h.source]:
            self.sequence_gaps += abs(h.seq - self.expected[h.source])
        self.expected[h.source] = h.seq + 1
        if h.t_sent:
            self.sent_stamps.append(h.t_sent)
        self.objects_received += 1
        self.bytes_received += sum(len(f) for f in frames)
        self.inputs_received += h.n_inputs
        self.entries_received += h.entries
        if entries_of(desc, data) != h.entries:
            self.content_mismatches += 1
            log.error(
                "%s: %s from merger %d holds %s entries, its inputs declared %s",
                self.node_id,
                desc.name,
                h.source,
                entries_of(desc, data),
                h.entries,
            )
        self.latest[(h.desc_key, h.source)] = (desc, data, h.entries)
        if self.cost is not None:  # a dear viewer: taking an object costs this much more
            self.cost.spend(1, data.nbytes, time.perf_counter_ns() - t0)

    def snapshot(self) -> list[tuple[ObjectDesc, np.ndarray, float]]:
        by_key: dict[bytes, list[tuple[ObjectDesc, np.ndarray, float]]] = {}
        for (key, _), item in sorted(self.latest.items(), key=lambda kv: kv[0][1]):
            by_key.setdefault(key, []).append(item)
        return [
            (items[0][0], merge(items[0][0], [i[1] for i in items]), sum(i[2] for i in items))
            for items in by_key.values()
        ]

    def write(self) -> None:
        if not self.output or not self.latest:
            return
        self.enter(BUSY)  # writing the objects out is the viewer's work
        try:
            write_objects(self.output, self.snapshot())
            self.files_written += 1
        except OSError as exc:
            self.write_errors += 1
            log.error("%s: cannot write %s: %s", self.node_id, self.output, exc)

    def batch_size(self) -> int:
        """How many messages to read at once: CHUNK, or, for a dear viewer, as many as cost at most
        TURN_S of added CPU time (at least one): it still answers its control socket in time."""
        cost, n = self.cost, self.objects_received
        return CHUNK if cost is None else cost.objects_per_turn(CHUNK, TURN_S, self.bytes_received // n if n else None)

    def read_batch(self) -> None:
        if self.cost is not None:
            self.cost.begin(time.monotonic())  # its first read: a cost that starts later counts from here
        recv, flag = self.data.recv, wire.FLAG_PAYLOAD_FRAME
        for _ in range(self.batch_size()):
            try:
                buf = recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            frames = [buf]
            # Only a large object's header (or something malformed) is followed by more frames: the
            # socket is asked only then, as asking costs more than receiving a small object.
            if (len(buf) < wire.FIXED.size or buf[6] & flag) and self.data.getsockopt(zmq.RCVMORE):
                frames.extend(f.buffer for f in self.data.recv_multipart(copy=False))
            self.on_message(frames)
        self.latency.record(self.sent_stamps, self.wall.now())
        self.sent_stamps.clear()

    def write_when_due(self) -> None:
        if time.monotonic() >= self.next_write:
            self.write()
            self.next_write = time.monotonic() + self.write_interval

    def run(self) -> int:
        self.next_write = time.monotonic() + self.write_interval
        self.receive_until(self.data, self.read_batch, lambda: all(self.eos), self.write_when_due)
        self.state = "DRAINING"
        self.write()
        self.state = "STOPPED"
        self.emit(
            "final",
            role=self.role,
            **self.counters(),
            output=self.output if self.files_written else None,
            write_errors=self.write_errors,
            input_latency=self.latency.total(),
            missing_eos=[i for i, e in enumerate(self.eos) if not e],
        )
        self.data.close(0)
        self.close()
        return 0
