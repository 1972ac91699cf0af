"""The ring as a client routes by: the same decisions as the server's
partition::Router (partition/router.h) and the C++ RingClient, from a
RingInfo that any instance's ring() answers.

Mark N(i) owns hashes [N(i-1), N(i)); the first mark also owns hashes from
the last mark up and below itself. An integer key's hash is the key; a
string key's is XXH64(key, seed 0) mod hashBound. A write goes to the head
of its chain; a read to the tail under sync replication, to any member
under async.
"""

import bisect

import xxhash


def hash_string(key, hash_bound):
    """The hash of string key "key" (bytes)."""
    return xxhash.xxh64_intdigest(key, 0) % hash_bound


class Ring:
    """An immutable view of one RingInfo.

    A standalone server answers one partition of mark 0 holding itself
    under its configured host (maybe 0.0.0.0) and ring version 0; the
    client then routes every call to the address it asked ("seed").
    """

    def __init__(self, info, seed):
        self.seed = seed
        self.version = info.version
        self.hash_bound = info.hashBound if info.hashBound > 0 else 0x7FFFFFFFFFFFFFFF
        self.replication = info.replication or "sync"
        self.change = info.change
        parts = sorted(info.partitions or [], key=lambda p: p.mark)
        self.standalone = info.version == 0 and len(parts) == 1 and parts[0].mark == 0
        self.marks = [p.mark for p in parts]
        if self.standalone:
            self.chains = [[seed]]
        else:
            self.chains = [["%s:%d" % (m.host, m.port) for m in p.chain] for p in parts]

    def owner(self, h):
        """Index into marks/chains of the partition that owns hash "h": the
        smallest mark greater than h, or the first if there is none."""
        i = bisect.bisect_right(self.marks, h)
        return 0 if i == len(self.marks) else i

    def target(self, index, write, spread=0):
        """The member ("host:port") that serves a call to partition "index";
        None when its chain is empty (no member serves the mark) or the
        ring has no mark at all (read from an instance before anything
        registered)."""
        if index >= len(self.chains):
            return None
        chain = self.chains[index]
        if not chain:
            return None
        if write:
            return chain[0]
        if self.replication == "sync":
            return chain[-1]
        return chain[spread % len(chain)]

    def members(self):
        """Every member of the ring, each once, in ring order."""
        out = []
        for chain in self.chains:
            for m in chain:
                if m not in out:
                    out.append(m)
        return out

    def hash_string(self, key):
        return hash_string(key, self.hash_bound)
