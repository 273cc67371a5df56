"""ImageService for a runtime with an empty image store, until podshim has images.

Containers run on the host's root filesystem; ContainerConfig.image is only recorded. So, as CRI
specifies for a store that holds nothing: ListImages lists nothing, ImageStatus of any image says
it is not present (an empty response, no error), RemoveImage of any image succeeds (removing what
is not there is no error); PullImage cannot succeed and answers UNIMPLEMENTED with a sentence
(crictl create pulls only when asked to: --with-pull). ImageFsInfo measures the (empty) store's
filesystem: :mod:`.images`.
"""

from __future__ import annotations

from typing import Any

from client.criapi import api_pb2
from shim.rpc.status import Unimplemented

from .handlers import Handlers

__all__ = ["EmptyImageStore"]


class EmptyImageStore(Handlers):
    """ListImages, ImageStatus, PullImage, RemoveImage over a store that holds nothing."""

    async def ListImages(self, request: api_pb2.ListImagesRequest, context: Any) -> api_pb2.ListImagesResponse:
        return api_pb2.ListImagesResponse()

    async def ImageStatus(self, request: api_pb2.ImageStatusRequest, context: Any) -> api_pb2.ImageStatusResponse:
        return api_pb2.ImageStatusResponse()  # image unset: "not present"

    async def PullImage(self, request: api_pb2.PullImageRequest, context: Any) -> api_pb2.PullImageResponse:
        raise Unimplemented(f"podshimd cannot pull images yet, so not {request.image.image!r}: containers run on "
                            "the host's root filesystem and need no image")

    async def RemoveImage(self, request: api_pb2.RemoveImageRequest, context: Any) -> api_pb2.RemoveImageResponse:
        return api_pb2.RemoveImageResponse()
