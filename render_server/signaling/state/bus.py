"""The message bus between signaling replicas: JSON messages on named channels.

Each channel has at most one handler per bus. Messages of a channel reach it in publish order,
one at a time (a queue and a task per channel); a handler that raises is logged and the next
message is delivered as usual. Delivery is at most once: `RedisBus` loses what is published
while its connection to Redis is down (it reconnects, with backoff, and subscribes again; an
outage is logged once as it begins and once as it ends, with its length).

`MemoryBus` serves one process (`render-server serve`, tests); buses that share a `MemoryHub`
reach each other as replicas on one Redis would.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.exceptions import RedisError

from render_server.protocol.bus import decode_bus_message
from render_server.protocol.errors import ProtocolError
from render_server.signaling.state.redis import (
    CONNECT_TIMEOUT_S,
    SOCKET_TIMEOUT_S,
    connect_redis,
    redact,
    redis_client,
)

log = logging.getLogger(__name__)

Message = dict[str, Any]
Handler = Callable[[Message], Awaitable[None]]


class Bus(Protocol):
    async def publish(self, channel: str, message: Message) -> None:
        """Send a JSON-able message to the channel's subscribers, on every replica."""
        ...

    async def subscribe(self, channel: str, handler: Handler) -> None:
        """Deliver the channel's messages to `handler` (replacing any other), from the moment
        this returns."""
        ...

    async def unsubscribe(self, channel: str) -> None:
        """No more deliveries on the channel (a handler already running finishes)."""
        ...

    async def close(self) -> None: ...


def _decode(channel: str, data: str | bytes) -> Message | None:
    """A message off the wire as its JSON object; None (logged) for anything else: too large,
    too deep, not JSON, not UTF-8, not an object."""
    try:
        return decode_bus_message(data)
    except ProtocolError as exc:
        log.warning(
            "bus.bad_message",
            extra={"channel": channel, "code": exc.code, "detail": exc.message[:200]},
        )
        return None


class _Delivery:
    """One channel: its handler, its queue, and the task that feeds it one message at a time."""

    def __init__(self, channel: str, handler: Handler, after: asyncio.Task[None] | None) -> None:
        self.channel = channel
        self.handler = handler
        self.queue: asyncio.Queue[Message | None] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(after), name=f"bus:{channel}")

    async def _run(self, after: asyncio.Task[None] | None) -> None:
        if after is not None:  # the channel's previous delivery may still run its last handler
            await asyncio.wait([after])
        while (message := await self.queue.get()) is not None:
            try:
                await self.handler(message)
            except Exception:
                log.exception("bus.handler_failed", extra={"channel": self.channel})

    def stop(self) -> None:
        """Drop what is queued; the handler now running (if any) finishes."""
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class _Deliveries:
    """The deliveries of one bus, by channel."""

    def __init__(self) -> None:
        self._by_channel: dict[str, _Delivery] = {}
        self._stopping: dict[str, asyncio.Task[None]] = {}

    def __contains__(self, channel: str) -> bool:
        return channel in self._by_channel

    def set(self, channel: str, handler: Handler) -> None:
        delivery = self._by_channel.get(channel)
        if delivery is not None:
            delivery.handler = handler
            return
        after = self._stopping.pop(channel, None)
        self._by_channel[channel] = _Delivery(channel, handler, after)

    def remove(self, channel: str) -> None:
        delivery = self._by_channel.pop(channel, None)
        if delivery is None:
            return
        delivery.stop()
        if not delivery.task.done():
            self._stopping[channel] = delivery.task
            delivery.task.add_done_callback(lambda task: self._forget(channel, task))

    def _forget(self, channel: str, task: asyncio.Task[None]) -> None:
        if self._stopping.get(channel) is task:
            del self._stopping[channel]

    def deliver(self, channel: str, message: Message) -> None:
        delivery = self._by_channel.get(channel)
        if delivery is not None:
            delivery.queue.put_nowait(message)

    async def close(self) -> None:
        tasks = [d.task for d in self._by_channel.values()] + list(self._stopping.values())
        self._by_channel.clear()
        self._stopping.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class MemoryHub:
    """What in-process buses share, as replicas share a Redis."""

    def __init__(self) -> None:
        self.buses: set[MemoryBus] = set()


class MemoryBus:
    """The in-process bus; buses on one `MemoryHub` reach each other."""

    def __init__(self, hub: MemoryHub | None = None) -> None:
        self.hub = hub or MemoryHub()
        self.hub.buses.add(self)
        self._deliveries = _Deliveries()

    async def publish(self, channel: str, message: Message) -> None:
        text = json.dumps(message)  # what Redis would carry: refuses what is not JSON-able
        for bus in list(self.hub.buses):
            if channel in bus._deliveries:
                # each bus decodes its own copy, with the limits a Redis subscriber applies
                copy = _decode(channel, text)
                if copy is not None:
                    bus._deliveries.deliver(channel, copy)

    async def subscribe(self, channel: str, handler: Handler) -> None:
        self._deliveries.set(channel, handler)

    async def unsubscribe(self, channel: str) -> None:
        self._deliveries.remove(channel)

    async def close(self) -> None:
        self.hub.buses.discard(self)
        await self._deliveries.close()


class RedisBus:
    """The bus over Redis pub/sub: one subscriber connection per bus, read by one task.

    Channels are named `{prefix}:{channel}` in Redis. `subscribe` returns once Redis has taken
    the SUBSCRIBE (a PING sent after it has come back), so a reply that a peer sends after that
    is not lost. When the connection drops, the reader reconnects with backoff and subscribes
    again to every channel.
    """

    def __init__(
        self,
        url: str,
        prefix: str = "rs",
        *,
        publisher: aioredis.Redis | None = None,
        confirm_timeout_s: float = 10.0,
        ping_interval_s: float = 15.0,
        backoff_s: tuple[float, float] = (0.05, 5.0),
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.confirm_timeout_s = confirm_timeout_s
        self.ping_interval_s = ping_interval_s
        self.backoff_s = backoff_s
        self._publisher = publisher if publisher is not None else redis_client(url)
        # the subscriber's connections (one at a time); protocol 2: messages and PING replies
        # come as plain arrays on a subscribed connection. Raw bytes: a payload is decoded by
        # the JSON reader, which refuses invalid UTF-8 as one bad message, where redis-py's
        # decoding would raise in the reader task and drop the connection.
        # Connecting and its handshake time out (a Redis that accepts and does not answer);
        # reading while subscribed waits up to ping_interval_s, then PINGs.
        self._pool = ConnectionPool.from_url(
            url, decode_responses=False, protocol=2,
            socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S,
        )  # fmt: skip
        self._deliveries = _Deliveries()
        self._wanted: set[str] = set()  # Redis channel names
        self._waiters: dict[str, asyncio.Future[None]] = {}  # PING token -> subscribe() waiting
        self._batches: dict[str, list[str]] = {}  # resubscription token -> waiters it answers
        self._conn: AbstractConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def connect(cls, url: str, prefix: str = "rs") -> RedisBus:
        """A bus on the Redis at `url`, which has answered (see `connect_redis`)."""
        return cls(url, prefix, publisher=await connect_redis(url, "bus"))

    def _name(self, channel: str) -> str:
        return f"{self.prefix}:{channel}"

    async def publish(self, channel: str, message: Message) -> None:
        await self._publisher.publish(self._name(channel), json.dumps(message))

    async def subscribe(self, channel: str, handler: Handler) -> None:
        """Effective when it returns; ConnectionError if Redis does not confirm in time (the
        subscription then stays, and takes effect when Redis is back: unsubscribe to drop it)."""
        if self._closed:
            raise RuntimeError("the bus is closed")
        name = self._name(channel)
        self._deliveries.set(channel, handler)
        self._wanted.add(name)
        token = uuid.uuid4().hex
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[token] = waiter
        if self._reader is None:
            self._reader = asyncio.create_task(self._read(), name="bus:reader")
        conn = self._conn
        if conn is not None and conn.is_connected:
            try:
                await conn.send_packed_command(
                    conn.pack_commands([("SUBSCRIBE", name), ("PING", token)]), check_health=False
                )
            except (RedisError, OSError):
                pass  # the reader reconnects, subscribes to every channel and answers the waiter
        try:
            async with asyncio.timeout(self.confirm_timeout_s):  # not wait_for (StateHealth.call)
                await asyncio.shield(waiter)
        except TimeoutError:
            raise ConnectionError(
                f"Redis at {redact(self.url)} did not confirm SUBSCRIBE {name} "
                f"in {self.confirm_timeout_s} s"
            ) from None
        finally:
            self._waiters.pop(token, None)

    async def unsubscribe(self, channel: str) -> None:
        name = self._name(channel)
        self._deliveries.remove(channel)
        self._wanted.discard(name)
        conn = self._conn
        if conn is not None and conn.is_connected:
            try:
                await conn.send_command("UNSUBSCRIBE", name, check_health=False)
            except (RedisError, OSError):
                pass  # not subscribed again after a reconnect: no longer wanted

    async def close(self) -> None:
        self._closed = True
        if self._reader is not None:
            # a cancellation that lands as a read times out can be swallowed (redis-py reads
            # under a timeout context): cancel until the task has ended
            while not self._reader.done():
                self._reader.cancel()
                await asyncio.wait([self._reader], timeout=0.1)
        if self._conn is not None:
            await self._conn.disconnect(nowait=True)
            self._conn = None
        for waiter in self._waiters.values():
            waiter.cancel()
        await self._deliveries.close()
        await self._publisher.aclose(close_connection_pool=True)
        await self._pool.disconnect()

    # -- the reader task -----------------------------------------------------------------------

    async def _read(self) -> None:
        delay, longest = self.backoff_s
        failures = 0
        lost_at = 0.0  # when the outage began (loop time), while failures > 0
        loop = asyncio.get_running_loop()
        while not self._closed:
            # what the pool's make_connection() does; redis-py leaves that one and connect()
            # unannotated, an untyped call under --strict only (hence unused-ignore)
            conn = self._pool.connection_class(**self._pool.connection_kwargs)
            try:
                await conn.connect()  # type: ignore[no-untyped-call, unused-ignore]
                # no await between taking the wanted channels and the waiters: a subscribe()
                # that comes later sends its own SUBSCRIBE on this connection
                self._conn = conn
                channels = sorted(self._wanted)
                token = uuid.uuid4().hex
                self._batches = {token: list(self._waiters)}  # older ones died with their link
                commands: list[tuple[str, ...]] = [("PING", token)]
                if channels:
                    commands.insert(0, ("SUBSCRIBE", *channels))
                await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
                if failures:
                    log.info(
                        "bus.reconnected",
                        extra={
                            "url": redact(self.url),
                            "channels": len(channels),
                            "outage_s": round(loop.time() - lost_at, 3),
                            "attempts": failures,
                        },
                    )
                failures = 0
                await self._listen(conn)
            except Exception as exc:  # Redis gone, or a reply not understood: start afresh
                if not failures:
                    lost_at = loop.time()
                failures += 1
                wait = min(longest, delay * 2 ** min(failures - 1, 16))
                self._log_failure(exc, failures, wait)
                await asyncio.sleep(wait)
            finally:
                self._conn = None
                await conn.disconnect(nowait=True)

    def _log_failure(self, exc: Exception, failures: int, wait: float) -> None:
        """One WARNING when an outage begins, DEBUG for each further attempt that fails; a
        traceback only for what is not Redis or the network failing (a bug)."""
        expected = isinstance(exc, RedisError | OSError)
        extra = {"url": redact(self.url), "error": repr(exc), "retry_in_s": wait}
        if failures == 1 or not expected:
            event = "bus.connection_lost" if failures == 1 else "bus.reconnect_failed"
            log.warning(event, extra=extra, exc_info=not expected)
        else:
            log.debug("bus.reconnect_failed", extra={**extra, "attempt": failures})

    async def _listen(self, conn: AbstractConnection) -> None:
        pinged = False
        while not self._closed:
            reply = await conn.read_response(
                timeout=self.ping_interval_s, disconnect_on_error=False
            )
            if reply is None:  # quiet for a while: is Redis still there?
                if pinged:
                    raise ConnectionError("no answer to PING")
                await conn.send_command("PING", "health", check_health=False)
                pinged = True
                continue
            pinged = False
            self._on_reply(reply)

    def _on_reply(self, reply: Any) -> None:
        if isinstance(reply, bytes):  # PING's answer when no channel is subscribed
            self._answered(_text(reply))
            return
        if not isinstance(reply, list) or not reply:
            return
        kind = reply[0]
        if kind == b"message" and len(reply) == 3:
            self._dispatch(_text(reply[1]), reply[2])
        elif kind == b"pong" and len(reply) == 2:
            self._answered(_text(reply[1]))

    def _answered(self, token: str) -> None:
        for t in [token, *self._batches.pop(token, ())]:
            waiter = self._waiters.get(t)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _dispatch(self, name: str, data: bytes) -> None:
        channel = name[len(self.prefix) + 1 :]
        message = _decode(channel, data)
        if message is not None:
            self._deliveries.deliver(channel, message)


def _text(value: Any) -> str:
    """A channel name or PING token off the subscriber connection (ours: ASCII)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def connect_bus(url: str | None) -> Bus:
    """The bus for `url`: None -> MemoryBus, redis:// or rediss:// -> RedisBus (PING checked)."""
    return MemoryBus() if url is None else await RedisBus.connect(url)
