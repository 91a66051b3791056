"""The Docker implementation of ale.data's ImageStore: what baked-data images need.

The only module that builds, inspects and reads data images through the Docker
SDK. Each reader is one fresh helper container of the image: created with network
``none``, never started, labelled ``ale.managed=1`` and ``ale.role=data-helper``
(so ale's cleanup finds it), running as root only to read root-owned files, and
removed when the reader closes. Paths are read with ``get_archive``, never through
a candidate's container.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import docker
import docker.errors

from ale.data.base import DataError, ImageInfo, ImageNotFound
from ale.data.hashing import CHUNK
from ale.sandbox.base import LABEL_MANAGED, LABEL_ROLE

HELPER_ROLE = "data-helper"


class DockerImageReader:
    """Reads paths of one image through one never-started helper container."""

    def __init__(self, container: Any, image: str) -> None:
        self.container = container
        self.image = image

    def exists(self, path: str) -> bool:
        """Whether path exists in the image; DataError when the engine fails to say."""
        api = self.container.client.api
        try:
            # HEAD on the archive endpoint stats the path without streaming it; the
            # SDK has no public call for it (APIClient is a requests.Session).
            url = api._url("/containers/{0}/archive", self.container.id)
            res = api.head(url, params={"path": path}, timeout=api.timeout)
        except Exception as exc:
            raise DataError(f"checking {path} in image {self.image} failed: {type(exc).__name__}: {exc}") from exc
        if res.status_code == 404:
            return False
        if res.status_code != 200:
            raise DataError(f"checking {path} in image {self.image} failed: HTTP {res.status_code} {res.text.strip()}")
        return True

    def get_tar(self, path: str) -> Iterator[bytes] | None:
        """The tar stream of path, or None when the image has no such path."""
        try:
            chunks, _stat = self.container.get_archive(path, chunk_size=CHUNK)
        except docker.errors.NotFound:
            return None
        except Exception as exc:
            raise DataError(f"reading {path} from image {self.image} failed: {type(exc).__name__}: {exc}") from exc
        return chunks


class DockerImageStore:
    """ale.data.base.ImageStore over a docker.DockerClient."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"DockerImageStore({self.client.api.base_url!r})"

    def lookup(self, ref: str) -> ImageInfo:
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound as exc:
            raise ImageNotFound(f"image {ref} is not in the Docker engine") from exc
        except Exception as exc:  # the engine is gone, the API refused, ...
            raise DataError(f"cannot look up image {ref} in the Docker engine: {type(exc).__name__}: {exc}") from exc
        labels = (image.attrs.get("Config") or {}).get("Labels") or {}
        return ImageInfo(id=str(image.id), labels=dict(labels))

    def build(self, context: Path, *, tag: str, labels: Mapping[str, str]) -> str:
        try:
            image, _logs = self.client.images.build(
                path=str(context), tag=tag, labels=dict(labels), rm=True, forcerm=True, pull=False
            )
        except Exception as exc:  # BuildError, APIError, a lost connection
            raise DataError(f"building the image {tag} from {context} failed: {exc}") from exc
        return str(image.id)

    @contextmanager
    def reader(self, image_id: str) -> Iterator[DockerImageReader]:
        try:
            container = self.client.containers.create(
                image_id,
                command=["sleep", "0"],
                network_mode="none",
                network_disabled=True,
                labels={LABEL_MANAGED: "1", LABEL_ROLE: HELPER_ROLE},
                user="0:0",
            )
        except Exception as exc:
            raise DataError(f"cannot create a helper container of image {image_id}: "
                            f"{type(exc).__name__}: {exc}") from exc
        try:
            yield DockerImageReader(container, image_id)
        finally:
            with suppress(Exception):
                container.remove(force=True, v=True)
