"""Run folders on object storage: ``trainer.save_dir`` as ``s3://bucket/prefix`` or ``gs://bucket/prefix``
(docs/buckets.md).

A run writes its folder on the local disk as it always does, in a staging folder that stands for the URL
(``staging_root()/s3/bucket/prefix/...``, ``.../gs/...``: one per process, so several processes share nothing but
the bucket), and this module copies what each save committed there into the bucket in the order a kill cannot make
inconsistent:

1. every process uploads the shard files it wrote *before* it reports them to process 0 (``publish``), so process 0
   writes an index only once every shard it names is in the bucket;
2. process 0 uploads the index (``checkpoint-latest.params``; a one-file checkpoint alone) in one PUT: that write is
   the commit. It is a conditional write, on the object's version (S3's ETag, GCS's generation): only if there is
   none for a run's first, only if it is still the one this run last wrote or read after it, so a second job
   writing the same run folder is refused rather than mixed (``STORES``: all that differs between S3 and GCS);
3. then the rest that changed (best, numbered checkpoints, ``metrics.jsonl``, ``train.log``, config, figures), the
   objects of local files that were removed (rotated step checkpoints), and the shard objects no index names.

Reading a run from its URL (``fetched``) downloads the objects directly in its folder and the shard objects its
indexes name into the staging folder, each checked against what the local reads take before it is downloaded
(``check_sizes``), and everything after reads the local copy with the usual checks (crc32 of every piece, the index
against its shards). Credentials and the endpoint come from the environment as botocore reads them
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ...), or as Google's libraries do
(``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server of a Cloud VM, ``STORAGE_EMULATOR_HOST``); messages never
show their values.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from files.writes import LATEST, LOCK_NAME, TEMP_NAME
from training.config.file import MAX_CONFIG_BYTES, ConfigError
from training.devices.memory import host_available, show_bytes
from training.run import shards
from training.run.folder import RunFolderError

URL = re.compile(r"(?P<scheme>[a-z0-9]+)://(?P<bucket>[^/?#]+)(?P<key>/[^?#]*)?")
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]")
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
HIDDEN = "***"
SINGLE_PUT = 5 * 2**30  # S3's largest PUT: a commit up to this size is one conditional request
INSTALL = "pip install -r requirements-buckets.txt"
COPY_CHUNK = 8 << 20  # bytes an object is downloaded in
# a command's first request to a bucket (train.py's write check, a reader's listing), retries included (gcsfs
# retries a refused connection for ~33 s): it takes well under a second where the bucket answers, a VM's first token
# a few more
PROBE_SECONDS = 15
# a folder's listing: a run folder of this template's holds tens of objects, its shards folder the kept checkpoints'
# shards of each process; a bucket someone else can write could hold millions (minutes of pages, gigabytes of memory)
LIST_MOST, LIST_SECONDS = 100_000, 300


# ------------------------------------------------------------------------------------- what differs, S3 and GCS
def s3_filesystem():
    import s3fs

    options = {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3}}
    return s3fs.S3FileSystem(skip_instance_cache=True, config_kwargs=options)


def s3_list(fs, folder: str, most: int, timeout: float) -> list[dict]:
    from fsspec.asyn import sync

    return sync(fs.loop, fs._lsdir, folder, refresh=True, max_items=most, timeout=timeout)  # s3fs's paged listing


def s3_put_if(fs, path: str, data: bytes, version: str | None) -> dict:
    """One PUT of `data`, with ``If-Match: <ETag>`` (``If-None-Match: *`` for no version)."""
    condition = {"IfMatch": version} if version else {"mode": "create"}
    return fs.pipe_file(path, data, chunksize=SINGLE_PUT, **condition) or {}


def gcs_filesystem():
    """gcsfs's JSON-API file system (its default class also asks gRPC for each bucket's layout). Credentials as
    Google's libraries find them; none with ``STORAGE_EMULATOR_HOST`` (an emulator), as google-cloud-storage does."""
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)  # its traceback when out of retries (ours is one line),
    from gcsfs.core import GCSFileSystem  # and the line its import logs

    anonymous = {"token": "anon"} if os.environ.get("STORAGE_EMULATOR_HOST") else {}
    return GCSFileSystem(skip_instance_cache=True, use_listings_cache=False, requests_timeout=60, **anonymous)


def gcs_list(fs, folder: str, most: int, timeout: float) -> list[dict]:
    return fs.ls(folder, detail=True, refresh=True, max_results=most, timeout=timeout)


def gcs_put_if(fs, path: str, data: bytes, version: str | None) -> dict:
    """One multipart upload of `data` with ``ifGenerationMatch`` (0 for no version: only if there is no object);
    gcsfs's own uploads take only the 0."""
    bucket, key, _ = fs.split_path(path)
    boundary = uuid.uuid4().hex
    body = b"".join([
        f"--{boundary}\r\nContent-Type: application/json\r\n\r\n{json.dumps({'name': key})}\r\n".encode(),
        f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(), data,
        f"\r\n--{boundary}--".encode(),
    ])  # fmt: skip
    return fs.call(
        "POST",
        f"{fs._location}/upload/storage/v1/b/{bucket}/o",
        uploadType="multipart",
        ifGenerationMatch=version or "0",
        headers={"Content-Type": f"multipart/related; boundary={boundary}"},
        data=body,
        json_out=True,
    )


@dataclass(frozen=True)
class Store:
    """All that differs between the object stores; the rest of this module is the same for each. A refused
    condition is a FileExistsError from both (s3fs's create, gcsfs's HTTP 412) or botocore's PreconditionFailed."""

    package: str  # the fsspec file system's, in requirements-buckets.txt
    version: str  # the field of an object's metadata that changes with every write of it: the commit's condition
    filesystem: Callable  # () -> a new file system (no listing cached from before)
    put_if: Callable  # (fs, path, data, version or None) -> the written object's metadata, or {}
    list: Callable  # (fs, folder, most, timeout) -> what the listing says of at most `most` objects in the folder


STORES = {
    "s3": Store("s3fs", "ETag", s3_filesystem, s3_put_if, s3_list),
    "gs": Store("gcsfs", "generation", gcs_filesystem, gcs_put_if, gcs_list),
}
SCHEMES = tuple(STORES)


def is_url(text) -> bool:
    return isinstance(text, str) and "://" in text and not text.startswith("file://")


def masked(text: str) -> str:
    """`text` without the credentials of the environment, and without a ``user:password@`` a URL may hold."""
    text = re.sub(r"(://[^/@\s:]*):[^/@\s]*@", rf"\1:{HIDDEN}@", str(text))
    for name in SECRET_VARIABLES:
        value = os.environ.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, HIDDEN)
    return text


def error_line(error: BaseException, timeout: float | None = None) -> str:
    """`error` in one line; ``timeout``: the bound fsspec put on the call that raised it (its error says nothing)."""
    if timeout and isinstance(error, TimeoutError):
        return f"no answer in {timeout} s"
    return masked(f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}")


def parse(url: str) -> tuple[str, str, str]:
    """(scheme, bucket, key without slashes at its ends) of a bucket URL; a ConfigError for anything else."""
    found = URL.fullmatch(url)
    if not found or found["scheme"] not in SCHEMES:
        raise ConfigError(f"{masked(url)}: expected s3://BUCKET/PREFIX or gs://BUCKET/PREFIX (the object stores "
                          f"this project writes to)")  # fmt: skip
    if not BUCKET_NAME.fullmatch(found["bucket"]):
        raise ConfigError(f"{masked(url)}: a bucket name is 3 to 63 of a-z, 0-9, '.', '-' and '_' (credentials go "
                          f"in the environment, never in the URL)")  # fmt: skip
    key = (found["key"] or "").strip("/")
    if any(part in ("", ".", "..") for part in key.split("/")) and key:
        raise ConfigError(f"{masked(url)}: a key with an empty, '.' or '..' part")
    return found["scheme"], found["bucket"], key


def staging_base() -> Path:
    """``TRAIN_STAGING_DIR``, else the user's cache folder (not a shared temporary one, where another user could
    have made the folder first)."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(os.environ.get("TRAIN_STAGING_DIR") or Path(cache) / "train-staging")


def staging_root(process: int | None = None) -> Path:
    """Where this process stages the run folders of bucket URLs: one folder per process, the bucket being the only
    place they share."""
    if process is None:
        import jax

        process = jax.process_index()
    return staging_base() / f"process_{process}"


def local_of(url: str) -> Path:
    scheme, bucket, key = parse(url)
    return staging_root() / scheme / bucket / key


def url_of(path: Path) -> str | None:
    """The bucket URL a staged path stands for, or None for a path outside the staging folder."""
    root = staging_root().resolve()
    path = Path(path).resolve()
    if not path.is_relative_to(root) or len(path.relative_to(root).parts) < 2:
        return None
    scheme, bucket, *key = path.relative_to(root).parts
    return f"{scheme}://{bucket}/{'/'.join(key)}".rstrip("/")


def here(path: str | Path) -> Path:
    """Process 0's run folder as this process stages it (its own folder for the same URL); any other path as is."""
    path, zero = Path(path), staging_root(0).resolve()
    if not Path(path).resolve().is_relative_to(zero):
        return path
    mine = staging_root() / Path(path).resolve().relative_to(zero)
    mine.mkdir(parents=True, exist_ok=True)
    return mine


def filesystem(url: str):
    """The fsspec file system of `url` (s3fs, gcsfs), new for this call: no listing cached from before."""
    store = STORES[parse(url)[0]]
    try:
        return store.filesystem()
    except ImportError as error:
        raise ConfigError(f"{masked(url)}: needs {error.name or store.package} ({INSTALL})") from None


def path_of(url: str) -> str:
    """`url` as fsspec names it (bucket/key)."""
    _, bucket, key = parse(url)
    return f"{bucket}/{key}".rstrip("/")


# ------------------------------------------------------------------------------------------ a run's folder copied
class Conflict(OSError):
    """A conditional write the bucket refused: the object is not the one this run last wrote or read."""


class Mirror:
    """What this process has put into the bucket of one staged run folder: each file's (size, mtime) when uploaded,
    and the version (S3's ETag, GCS's generation) of the latest checkpoint, which the next commit must still find
    there."""

    def __init__(self, run_dir: Path, url: str):
        self.run_dir, self.url, self.fs = Path(run_dir), url, filesystem(url)
        self.store = STORES[parse(url)[0]]
        self.uploaded: dict[str, tuple[int, int]] = {}
        self.version: str | None = None
        self.refused = False  # a commit refused or failed: the run folder in the bucket is left as it is

    def object(self, name: str) -> str:
        return f"{path_of(self.url)}/{name}"

    def put(self, name: str, conditional: bool = False) -> dict:
        """`name` uploaded; `conditional`: in one request, only if the object is still at ``self.version``."""
        path = self.run_dir / name
        info = os.stat(path)
        try:
            if not conditional:  # streamed, in parts when large
                out = self.fs.put_file(str(path), self.object(name))
            else:  # one request (up to 5 GB), the condition on it: read whole
                out = self.store.put_if(self.fs, self.object(name), path.read_bytes(), self.version)
        except Exception as error:  # noqa: BLE001 (botocore's, s3fs's, gcsfs's and aiohttp's errors alike: one line)
            text = f"{error} {getattr(error, '__cause__', '')}"
            failed = isinstance(error, FileExistsError) or "PreconditionFailed" in text or "pre-condition" in text
            raise (Conflict if conditional and failed else OSError)(f"{self.url}/{name}: {error_line(error)}") from None
        self.uploaded[name] = (info.st_size, info.st_mtime_ns)
        return out or {}

    def publish(self, path: Path) -> None:
        """A shard file this process wrote, uploaded before it is reported: an index names only shards in the
        bucket. A process other than 0 then drops its local copy (nothing reads it there)."""
        import jax

        self.put(Path(path).relative_to(self.run_dir).as_posix())
        if jax.process_index() != 0:
            Path(path).unlink(missing_ok=True)

    def commit(self, run_dir: Path, names: list[str]) -> None:
        """Process 0, once a save is committed locally: its index (the commit, conditional), then the rest."""
        first = names[0]  # every save's first name is the latest checkpoint: the one a resume starts from
        try:
            out = self.put(first, conditional=first == LATEST)
        except Conflict:
            self.refused = True
            raise RunFolderError(
                f"{self.url}/{first}: changed in the bucket since this run last wrote it (another job writing "
                f"the same run folder?); this checkpoint was not committed there"
            ) from None
        except OSError as error:
            self.refused = True
            raise RunFolderError(f"cannot write {error}; the bucket keeps its previous checkpoint") from None
        if first == LATEST:
            version = out.get(self.store.version) or self.fs.info(self.object(first)).get(self.store.version)
            self.version = None if version is None else str(version)
        try:
            self.sync()
        except OSError as error:
            raise RunFolderError(f"cannot write {error}; {self.url}/{first} holds the checkpoint") from None

    def sync(self) -> None:
        """Process 0: every file of the run folder that changed since it was uploaded (shards aside), the objects of
        files removed since, and the shard objects no index names. Nothing once a commit was refused or failed: the
        run's end would put its index over the bucket's, unconditionally, and delete the shard objects that one
        names."""
        if self.refused:
            return
        present = set()
        for path in sorted(self.run_dir.rglob("*")):
            name = path.relative_to(self.run_dir).as_posix()
            if (
                path.is_symlink()
                or not path.is_file()
                or name == LOCK_NAME
                or TEMP_NAME.fullmatch(path.name)
                or name.startswith(f"{shards.SHARDS}/")
                or "__pycache__" in name
            ):
                continue
            present.add(name)
            info = path.stat()
            if self.uploaded.get(name) != (info.st_size, info.st_mtime_ns):
                self.put(name)
        gone = [n for n in self.uploaded if n not in present and not n.startswith(f"{shards.SHARDS}/")]
        kept = shards.referenced(self.run_dir)
        try:
            found = [f"{shards.SHARDS}/{name}" for name in listing(self.url, self.fs, self.object(shards.SHARDS))]
            for name in gone:
                self.fs.rm_file(self.object(name))
                del self.uploaded[name]
            for name in (name for name in found if name not in kept):
                self.fs.rm_file(self.object(name))
                self.uploaded.pop(name, None)
        except Exception as error:  # noqa: BLE001
            raise OSError(f"{self.url}: {error_line(error)}") from None


def listing(url: str, fs, folder: str, timeout: float = LIST_SECONDS) -> dict[str, dict]:
    """The objects directly in `folder` (a bucket path, not its subfolders), by name: what the listing says of
    each (its size, its version). ``timeout``: the bound of the whole call, retries included; more than LIST_MOST
    objects are refused."""
    try:
        found = STORES[parse(url)[0]].list(fs, folder, LIST_MOST + 1, timeout)
    except FileNotFoundError:
        return {}
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"{masked(url)}: cannot list it ({error_line(error, timeout)})") from None
    files = {info["name"].rstrip("/").rsplit("/", 1)[-1]: info for info in found if info.get("type") == "file"}
    if len(files) > LIST_MOST:
        raise ConfigError(f"{masked(url)}: more than {LIST_MOST:,} objects in {folder}: no run folder's; refused")
    return files


def size_limit(name: str) -> tuple[int, str] | None:
    """The most bytes the local reads of a run folder take of file `name`, and what sets it: a JSON file's bound,
    a checkpoint file read whole into memory; None for the files read piece by piece (shards) or line by line."""
    if name.endswith(".json"):
        return MAX_CONFIG_BYTES, "a JSON file's bound"
    if name.endswith(".params"):
        return host_available()
    return None


def check_sizes(url: str, local: Path, sizes: dict[str, int]) -> None:
    """Objects larger than a local read of them would take, or more bytes than the staging disk has free: refused
    in one line, before a byte is downloaded (a bucket someone else can write must not fill the disk)."""
    for name, size in sizes.items():
        limit = size_limit(name)
        if limit and size > limit[0]:
            raise ConfigError(f"{masked(url)}/{name}: {show_bytes(size)}, more than the {show_bytes(limit[0])} of "
                              f"{limit[1]}; not downloaded")  # fmt: skip
    free = shutil.disk_usage(local).free
    if sum(sizes.values()) > free:
        raise ConfigError(f"{masked(url)}: {show_bytes(sum(sizes.values()))} to download, more than the "
                          f"{show_bytes(free)} free in {local}; not downloaded")  # fmt: skip


def download(url: str, local: Path) -> Mirror:
    """The run folder at `url` into `local` (emptied first: the bucket is the run's truth): the objects directly in
    it and the shard objects its indexes name, nothing else (the model's code, a profile, anything a bucket's other
    writers put there stay in the bucket), each at most the size its listing gave. Returns its Mirror, knowing what
    is there."""
    mirror = Mirror(local, url)
    fs, root = mirror.fs, path_of(url)
    top = listing(url, fs, root, timeout=PROBE_SECONDS)  # a command's first request: an endpoint that is not there
    if not top:
        raise ConfigError(f"{masked(url)}: no such run folder in the bucket")
    if local.is_symlink():
        raise ConfigError(f"{local}: a symbolic link where the run folder of {masked(url)} is staged")
    shutil.rmtree(local, ignore_errors=True)
    local.mkdir(parents=True)

    def get(objects: dict[str, dict]) -> None:
        check_sizes(url, local, {name: int(info.get("size") or 0) for name, info in objects.items()})
        for name, info in sorted(objects.items()):
            if name in ("", ".", ".."):
                raise ConfigError(f"{masked(url)}/{name}: an object name that is no file of a run folder; refused")
            target, left = local / name, int(info.get("size") or 0)
            try:  # an object named "shards" beside the shard objects makes the folder a file: refused here too
                target.parent.mkdir(exist_ok=True)
                with fs.open(f"{root}/{name}", "rb") as source, open(target, "xb") as out:
                    while chunk := source.read(COPY_CHUNK):
                        left -= len(chunk)
                        if left < 0:
                            raise OSError("larger than the listing said; refused")
                        out.write(chunk)
            except Exception as error:  # noqa: BLE001
                raise ConfigError(f"{masked(url)}/{name}: cannot read it ({error_line(error)})") from None
            written = target.stat()
            mirror.uploaded[name] = (written.st_size, written.st_mtime_ns)

    try:
        get(top)
        named = shards.referenced(local)  # a missing one is refused when read
        get({f"{shards.SHARDS}/{n}": info for n, info in listing(url, fs, f"{root}/{shards.SHARDS}").items()
             if f"{shards.SHARDS}/{n}" in named})  # fmt: skip
    except ConfigError:
        shutil.rmtree(local, ignore_errors=True)  # nothing half downloaded stays
        raise
    if LATEST in top:
        mirror.version = top[LATEST].get(mirror.store.version)
    return mirror


MIRRORS: dict[Path, Mirror] = {}  # this process's, by staged run folder


def fetched(text: str | None) -> str | None:
    """A checkpoint or run folder named by a bucket URL, downloaded with its run folder: its local path (as
    text); anything else as it is. A ConfigError, one line, when the bucket cannot give it."""
    if isinstance(text, str) and text.startswith("file://"):
        return text.removeprefix("file://")
    if not is_url(text):
        return text
    scheme, bucket, key = parse(text)
    folder_key = key.rsplit("/", 1)[0] if key.endswith(".params") else key
    if not folder_key:
        raise ConfigError(f"{masked(text)}: name a run folder (or a checkpoint in one) inside the bucket")
    folder_url = f"{scheme}://{bucket}/{folder_key}"
    local = local_of(folder_url)
    MIRRORS[local.resolve()] = download(folder_url, local)
    return str(local_of(text))


def local_copy(text: str | None) -> str | None:
    """``fetched`` for a command line: what the bucket cannot give is one line and exit status 2."""
    try:
        return fetched(text)
    except ConfigError as error:
        from training.run.cli import fail

        fail(str(error))


def check_writable(url: str) -> None:
    """The bucket answers and takes a write under `url`: an object written and removed, before anything else."""
    fs = filesystem(url)
    probe = f"{path_of(url)}/.write-check-{os.getpid()}"
    try:  # fsspec's timeout: the whole call, its retries with it
        fs.pipe_file(probe, b"", timeout=PROBE_SECONDS)
        fs.rm_file(probe, timeout=PROBE_SECONDS)
    except Exception as error:  # noqa: BLE001
        raise ConfigError(
            f"trainer.save_dir: {masked(url)}: cannot write there ({error_line(error, PROBE_SECONDS)})"
        ) from None


def stage(config: dict) -> None:
    """A bucket URL in ``trainer.save_dir`` checked (it answers, takes a write) and replaced by its staging folder,
    from which ``attach`` copies the run into the bucket."""
    save_dir = config["trainer"]["save_dir"]
    if isinstance(save_dir, str) and save_dir.startswith("file://"):
        config["trainer"]["save_dir"] = save_dir.removeprefix("file://")
        return
    if not is_url(save_dir):
        return
    parse(save_dir)
    check_writable(save_dir)
    config["trainer"]["save_dir"] = str(local_of(save_dir))


def as_given(config: dict) -> dict:
    """`config` as the run folder's config.json records it: a staged save_dir as the bucket's URL it stands for."""
    url = url_of(Path(config["trainer"]["save_dir"]))
    return config if url is None else {**config, "trainer": {**config["trainer"], "save_dir": url}}


def local_only(config: dict, who: str) -> None:
    """A ConfigError where `who` (``utils.fit``) is given a bucket URL for save_dir: only train.py copies a run into
    a bucket."""
    if is_url(config["trainer"]["save_dir"]):
        raise ConfigError(
            f"{who}: trainer.save_dir {masked(config['trainer']['save_dir'])}: a run folder in a bucket is written by "
            f"train.py (docs/buckets.md); give a local folder"
        )


def fetch_named(config: dict) -> None:
    """``-r auto`` with a bucket: the run named by trainer.run_id, downloaded from the bucket where it is there (its
    newest committed checkpoint is the bucket's checkpoint-latest.params)."""
    url = url_of(Path(config["trainer"]["save_dir"]))
    if url is None or not config["trainer"]["run_id"]:
        return
    run_url = f"{url}/{config['name']}/{config['trainer']['run_id']}"
    fs = filesystem(run_url)
    try:
        there = fs.exists(f"{path_of(run_url)}/{LATEST}")
    except Exception as error:  # noqa: BLE001
        raise ConfigError(f"{masked(run_url)}: cannot read it ({error_line(error)})") from None
    if there:
        fetched(run_url)


def attach(checkpoints, run_dir: Path, new: bool) -> Mirror | None:
    """Copies the run's saves into the bucket when its folder is a staged one: the hooks of ``Checkpoints`` set,
    and on process 0 what the folder holds already (config, model code) uploaded now. ``new``: a folder this run
    made, which the bucket must not hold a checkpoint of (another machine's run of that name)."""
    import jax

    from training.run.cli import fail

    url = url_of(run_dir)
    if url is None:
        return None
    mirror = MIRRORS.get(Path(run_dir).resolve()) or Mirror(run_dir, url)
    MIRRORS[Path(run_dir).resolve()] = mirror
    checkpoints.publish = mirror.publish
    if jax.process_index() == 0:
        logging.getLogger("train").info(f"run folder in the bucket: {masked(url)} (staged in {run_dir})")
        checkpoints.committed = lambda folder, names: mirror.commit(folder, names)
        try:
            if new and mirror.fs.exists(mirror.object(LATEST)):
                shutil.rmtree(run_dir, ignore_errors=True)  # made by this run: nothing of it stays
                fail(
                    f"{masked(url)}: holds a run with a checkpoint already (another machine's?): continue it with "
                    f"-r auto or -r {masked(url)}/{LATEST}, or choose another --run-id"
                )
            mirror.sync()
        except Exception as error:  # noqa: BLE001 (an OSError of ours, or botocore's from exists)
            fail(f"cannot write {masked(url)}: {error_line(error)}; the run did not start")
    return mirror


def finish(run_dir: Path) -> None:
    """Process 0, at the run's end: what was written since the last save (the log's last lines, the figures)."""
    mirror = MIRRORS.get(Path(run_dir).resolve())
    if mirror is None:
        return
    try:
        mirror.sync()
    except OSError as error:
        print(f"warning: {error}: the bucket lacks the run's last files (its checkpoints are there)")
