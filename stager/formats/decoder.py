"""What a reader calls for each sample: a decoder, from a loader's name, a callable or a front end's object.

A loader of one path (``raw``, ``npy``, a ``module:function``) decodes a
file and needs nothing else. A front end that runs the user's own dataset
code needs more: which sample a file is (its catalog index) and the epoch,
to seed random transforms per sample, and a moment in each reader process
before its first sample (``worker_init_fn``, the worker's identity). Such a
front end hands the pipeline a ``SampleDecoder``.
"""


class SampleDecoder:
    """The protocol readers call. Subclass it, or give an object these two methods.

    ``start`` runs once in each reader process before its first sample;
    ``decode`` turns one staged file into one sample. The object travels to
    the readers (inherited with ``fork``, pickled otherwise).
    """

    def start(self, worker, workers):
        """Called once in reader ``worker`` (of ``engine.workers.loops`` at its start), before its first sample."""

    def decode(self, path, index, epoch):
        """The sample of catalog entry ``index``, from the file at ``path``, read in epoch ``epoch``."""
        raise NotImplementedError

    def keeps_decoded(self):
        """Whether this decoder's loader is a pure function of the file's bytes, whose results the decoded tier
        (``staging.decoded``) may keep. By default: not."""
        return False

    def decoded_kind(self):
        """What the records this decoder keeps in the decoded tier hold: equal only for decoders whose records
        may stand for each other's (by default, this class's)."""
        return f"{type(self).__module__}.{type(self).__qualname__}"

    def use_decoded(self, tier):
        """Offered the node's ``decoded.DecodedTier`` in each reader: True where this decoder takes it.

        A decoder takes it where ``keeps_decoded()``, keeps it as ``_tier``,
        and calls ``tier.load(index, path, loader)`` where it would call
        ``loader(path)``.
        """
        if not self.keeps_decoded():
            return False
        self._tier = tier
        return True


class PathDecoder(SampleDecoder):
    """A loader of one path (``(path) -> sample``) as a ``SampleDecoder``."""

    def __init__(self, load):
        self.load = load

    def decode(self, path, index, epoch):
        return self.load(path)


class ImageDecoder(SampleDecoder):
    """The ``image`` loader, whose decoding (bytes to a uint8 HWC array) is pure: it can use the decoded tier.

    The tier keeps the HWC pixels, a quarter of the float32 CHW layout's
    bytes; the layout is made from them for each sample.
    """

    def __init__(self, options):
        from .files import image_rgb

        self.options = options
        self.rgb = image_rgb(options)
        self._tier = None

    def keeps_decoded(self):
        return True

    def decode(self, path, index, epoch):
        from .images import in_layout

        hwc = self._tier.load(index, path, self.rgb) if self._tier is not None else self.rgb(path)
        return in_layout(hwc, self.options)


def decoded_kind(decoder):
    """``decoder.decoded_kind()``, or None for a decoder that has only the protocol's two methods."""
    return getattr(decoder, "decoded_kind", lambda: None)()


def is_decoder(spec):
    """Whether ``spec`` is a ``SampleDecoder`` (or has its two methods)."""
    return isinstance(spec, SampleDecoder) or (callable(getattr(spec, "decode", None))
                                               and callable(getattr(spec, "start", None)))


def make_decoder(spec, options):
    """The ``SampleDecoder`` for a loader spec: a ``SampleDecoder`` as it is, anything else through ``make_loader``.

    Args:
        spec: A ``SampleDecoder``, a registry name, ``module:function`` or a
            callable taking one path.
        options: The loaders' options (``hdf5_key``, ``layout``).
    """
    if is_decoder(spec):
        return spec
    if spec == "image":
        return ImageDecoder(options)
    from .files import make_loader  # the path loaders' registry

    return PathDecoder(make_loader(spec, options))
