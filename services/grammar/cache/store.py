"""The shared Redis store of grammar records under one byte budget, and build locks.

Layout (all names start with `prefix`, default "infernix:grammar"):

- `{prefix}:{vocab_id}:{format}:g:{key}`    an encoded `cache.records.Record`: the build
                                            verdict and, when the store policy keeps it, the blob;
- `{prefix}:{vocab_id}:{format}:lock:{key}` the build lock of that key (SET NX PX, a random token);
- `{prefix}:lru` (sorted set: blob name -> logical clock of its last use), `{prefix}:size` (hash:
  blob name -> bytes), `{prefix}:bytes` (their sum), `{prefix}:clock` (the logical clock).

Eviction is ours, not Redis's maxmemory policy: every put runs one Lua script that stores the blob,
stamps it in the LRU index and deletes least-recently-used blobs until the sum is within
`budget_bytes`; every get stamps the blob it returns. The budget is shared by all models (one Redis,
one quota). A value larger than the budget is never stored. Run Redis with `maxmemory` above the
budget (or without one): if Redis evicts by itself, the index heals as gets find values missing.
Names include the record and serialisation format, so an upgrade never reads an old format.

Redis trouble never fails a request: every operation raises `StoreUnavailable` instead, which the
cache answers by compiling in process. The first failure of an outage logs one warning; during an
outage Redis is retried at most every `retry_s` seconds, so requests do not pay a connect timeout
each; the first success after it logs `grammar_redis_reconnected`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from services.grammar.cache.records import BLOB_FORMAT
from shared.logging import get_logger

log = get_logger(__name__)

# The record layout (records.Record.encode) on top of the blob's serialisation and compression.
RECORD_FORMAT = f"{BLOB_FORMAT}-r1"

# KEYS: blob, lru, size, bytes, clock.  ARGV: payload, budget.  Returns the number evicted, or -1
# when the payload alone is over the budget (nothing stored).
_PUT = """
local n = string.len(ARGV[1])
local budget = tonumber(ARGV[2])
if n > budget then return -1 end
local old = redis.call('HGET', KEYS[3], KEYS[1])
if old then redis.call('DECRBY', KEYS[4], old) end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[3], KEYS[1], n)
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[5]), KEYS[1])
local total = redis.call('INCRBY', KEYS[4], n)
local evicted = 0
while total > budget do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not oldest then redis.call('SET', KEYS[4], 0) break end
  local size = tonumber(redis.call('HGET', KEYS[3], oldest) or '0')
  redis.call('DEL', oldest)
  redis.call('ZREM', KEYS[2], oldest)
  redis.call('HDEL', KEYS[3], oldest)
  total = redis.call('DECRBY', KEYS[4], size)
  evicted = evicted + 1
end
return evicted
"""

# KEYS: blob, lru, size, bytes, clock.  Returns the blob (stamping it as used) or nil (dropping a
# stale index entry of a blob Redis no longer holds).
_GET = """
local v = redis.call('GET', KEYS[1])
if v then
  redis.call('ZADD', KEYS[2], 'XX', redis.call('INCR', KEYS[5]), KEYS[1])
  return v
end
local size = redis.call('HGET', KEYS[3], KEYS[1])
if size then
  redis.call('HDEL', KEYS[3], KEYS[1])
  redis.call('ZREM', KEYS[2], KEYS[1])
  redis.call('DECRBY', KEYS[4], size)
end
return false
"""

# KEYS: lock.  ARGV: token, ttl_ms.  Extend (or, with ttl 0, delete) a lock only if we hold it.
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) == 0 then return redis.call('DEL', KEYS[1]) end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""


class StoreUnavailable(Exception):
    """Redis could not be used for this operation (down, timed out, refused the command)."""


@dataclass(frozen=True)
class StoreConfig:
    url: str  # redis://host:port/db
    budget_bytes: int = 256 * 1024 * 1024  # compressed blobs kept in Redis, all models together
    prefix: str = "infernix:grammar"
    timeout_s: float = 0.5  # socket connect and read timeout of every Redis command
    retry_s: float = 1.0  # during an outage, try Redis again at most this often

    def __post_init__(self) -> None:
        if not self.url:
            raise ValueError("StoreConfig.url must name a Redis server")
        if self.budget_bytes <= 0:
            raise ValueError(f"StoreConfig.budget_bytes must be > 0, got {self.budget_bytes}")
        if self.timeout_s <= 0 or self.retry_s < 0:
            raise ValueError("StoreConfig.timeout_s must be > 0 and retry_s >= 0")


class RedisStore:
    """Compressed grammar blobs and build locks in one Redis, shared by every model's cache."""

    def __init__(self, config: StoreConfig) -> None:
        self.config = config
        self._redis = aioredis.Redis.from_url(
            config.url,
            socket_timeout=config.timeout_s,
            socket_connect_timeout=config.timeout_s,
            retry=Retry(NoBackoff(), 1),  # one reconnect for a pooled connection Redis dropped
        )
        self._writes: set[asyncio.Task] = set()  # background writes that aclose() completes
        self._put = self._redis.register_script(_PUT)
        self._get = self._redis.register_script(_GET)
        self._renew = self._redis.register_script(_RENEW)
        p = config.prefix
        self._index = (f"{p}:lru", f"{p}:size", f"{p}:bytes", f"{p}:clock")
        self._down = False
        self._retry_at = 0.0

    # -- names -------------------------------------------------------------------------------

    def blob_name(self, vocab_id: str, key: str) -> str:
        return f"{self.config.prefix}:{vocab_id}:{RECORD_FORMAT}:g:{key}"

    def lock_name(self, vocab_id: str, key: str) -> str:
        return f"{self.config.prefix}:{vocab_id}:{RECORD_FORMAT}:lock:{key}"

    # -- health ------------------------------------------------------------------------------

    async def _call(self, op: str, coro_factory):
        if self._down and time.monotonic() < self._retry_at:
            raise StoreUnavailable(f"redis is unavailable (retrying every {self.config.retry_s} s)")
        try:
            result = await coro_factory()
        except (RedisError, OSError, TimeoutError) as exc:
            self._retry_at = time.monotonic() + self.config.retry_s
            if not self._down:
                self._down = True
                log.warning("grammar_redis_unavailable", op=op, error=type(exc).__name__,
                            detail=str(exc)[:200])
            raise StoreUnavailable(f"redis {op} failed: {type(exc).__name__}") from exc
        if self._down:
            self._down = False
            log.info("grammar_redis_reconnected", op=op)
        return result

    async def ping(self) -> bool:
        """True when Redis answers now (also ends an outage)."""
        try:
            await self._call("ping", self._redis.ping)
        except StoreUnavailable:
            return False
        return True

    # -- blobs -------------------------------------------------------------------------------

    async def get(self, vocab_id: str, key: str) -> bytes | None:
        """The blob of `key`, stamped as recently used, or None. Raises StoreUnavailable."""
        name = self.blob_name(vocab_id, key)
        value = await self._call("get", lambda: self._get(keys=[name, *self._index]))
        return value if value else None

    async def put(self, vocab_id: str, key: str, blob: bytes) -> bool:
        """Store `blob`, evicting least-recently-used blobs to stay within the budget.

        Returns False (nothing stored) when the blob alone exceeds the budget. Raises
        StoreUnavailable."""
        name = self.blob_name(vocab_id, key)
        evicted = await self._call(
            "put",
            lambda: self._put(keys=[name, *self._index], args=[blob, self.config.budget_bytes]),
        )
        if evicted > 0:
            log.info("grammar_redis_evicted", count=int(evicted))
        return evicted >= 0

    async def discard(self, vocab_id: str, key: str) -> None:
        """Drop a blob (one that failed to deserialise); the index heals on the next get."""
        name = self.blob_name(vocab_id, key)
        await self._call("discard", lambda: self._redis.delete(name))

    async def stored_bytes(self) -> int:
        """The byte sum the LRU index accounts for. Raises StoreUnavailable."""
        value = await self._call("bytes", lambda: self._redis.get(self._index[2]))
        return int(value or 0)

    # -- build locks ---------------------------------------------------------------------------

    async def try_lock(self, vocab_id: str, key: str, ttl_ms: int) -> str | None:
        """Take the build lock of `key` for `ttl_ms` (SET NX PX); the token, or None when another
        holder has it. Raises StoreUnavailable."""
        token = secrets.token_hex(8)
        name = self.lock_name(vocab_id, key)
        ok = await self._call("lock", lambda: self._redis.set(name, token, nx=True, px=ttl_ms))
        return token if ok else None

    async def renew_lock(self, vocab_id: str, key: str, token: str, ttl_ms: int) -> bool:
        """Extend our lock to `ttl_ms` from now; False when it is no longer ours."""
        name = self.lock_name(vocab_id, key)
        return bool(
            await self._call("renew", lambda: self._renew(keys=[name], args=[token, ttl_ms]))
        )

    async def unlock(self, vocab_id: str, key: str, token: str) -> None:
        """Release our lock (a lock that expired and was taken by someone else stays theirs)."""
        name = self.lock_name(vocab_id, key)
        await self._call("unlock", lambda: self._renew(keys=[name], args=[token, 0]))

    def track(self, task: asyncio.Task) -> None:
        """Own a background write: `aclose` waits for it before closing the connection."""
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def aclose(self) -> None:
        """Finish the background writes, then close the connection."""
        while self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)
        await self._redis.aclose()
