"""The coordinator's key-value store, which ``jax.distributed`` runs on process 0 for a run of several processes:
the watchdog's signs of life, process 0's run folder shared with the others, and the meeting at the end."""

from __future__ import annotations

from training.devices.mesh import DistributedError

# How long processes wait for each other at start-up (nodes of a job start minutes apart) and at the end.
WAIT_S = 300


def client():
    """``jax.distributed``'s client of the coordinator's key-value store."""
    # JAX 0.12 offers no public way to this store (jax.distributed exports initialize, is_initialized and shutdown
    # only), so this is the template's one import from jax._src. A collective is no stand-in for it:
    # multihost_utils.broadcast_one_to_all would leave process 0 waiting for ever when it stops before training
    # while the others stopped too, where setting a key returns at once; and a collective has no timeout.
    from jax._src.distributed import global_state

    return global_state.client


def share_text(name: str, text: str | None = None, timeout_s: int = WAIT_S) -> str:
    """Process 0's `text` on every process; the others wait for it. An empty text is process 0's word that it
    stopped (the others then raise DistributedError)."""
    import jax

    key = f"train/{name}"
    if jax.process_index() == 0:
        client().key_value_set(key, text)
        return text
    try:
        text = client().blocking_key_value_get(key, timeout_s * 1000)
    except Exception as error:  # the coordinator ended (process 0 stopped) or timed out
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DistributedError(
            f"process 0 did not share its {name} (it stopped before training; see its output): {first}"
        ) from None
    if not text:
        raise DistributedError(f"process 0 stopped before training (its output says why); no {name}")
    return text


def meet(name: str, timeout_s: int = WAIT_S) -> None:
    """Waits until every process got here (at most `timeout_s`)."""
    client().wait_at_barrier(f"train/{name}", timeout_s * 1000)


def gather_texts(name: str, text: str, timeout_s: int = WAIT_S) -> list[str] | None:
    """Every process's `text`, in process order, on process 0 (None on the others, which do not wait): what each
    process reports of its part of a checkpoint, which process 0 commits once all have. Safe from a thread other
    than the one running the step (the store's client is)."""
    import jax

    key = f"train/{name}"
    index, count = jax.process_index(), jax.process_count()
    if index:
        client().key_value_set(f"{key}/{index}", text)
        return None
    texts = [text]
    for other in range(1, count):
        try:
            texts.append(client().blocking_key_value_get(f"{key}/{other}", timeout_s * 1000))
        except Exception as error:  # the coordinator's wait ran out, or the run is ending
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise DistributedError(f"process {other} did not report its {name}: {first}") from None
    return texts
