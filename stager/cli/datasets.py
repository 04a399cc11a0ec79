"""The commands that write datasets (with ``stager demo``, the only ones): ``make-dataset`` and ``pack``."""

import argparse

from ..config import load_config
from ..errors import StagerError


def _positive(text):
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _cmd_make_dataset(args):
    from ..job.source import write_synthetic
    from ..job.synth import JPEG_BYTES, make_dataset, parse_image_sizes

    if args.config:
        if args.dir or args.samples:
            raise StagerError("make-dataset: give either --config (its synthetic section and dataset.source) or "
                              "DIR and --samples, not both")
        cfg = load_config(args.config, args.set)
        manifest, written = write_synthetic(cfg, progress=not args.quiet)
        print(f"wrote {cfg.synthetic.samples} samples and {manifest}" if written
              else f"{manifest} already lists the {cfg.synthetic.samples} samples of {args.config}")
        return 0
    if not args.dir or not args.samples:
        raise StagerError("make-dataset: give DIR and --samples, or --config FILE")
    if "://" in args.dir:
        raise StagerError(f"make-dataset writes a local directory; {args.dir} is a URL")
    nbytes = args.bytes or (JPEG_BYTES if "jpeg" in (args.format, args.content) else 196_736)
    sizes = None
    if args.image_size:
        if args.format != "jpeg":
            raise StagerError(f"make-dataset: --image-size is for --format jpeg, not {args.format}")
        try:
            sizes = parse_image_sizes(args.image_size)
        except ValueError as exc:
            raise StagerError(f"make-dataset: --image-size: {exc}") from None
    if args.format in ("tar", "hdf5"):
        from ..job.packing import make_shards

        manifest = make_shards(args.dir, args.format, args.samples, nbytes, args.classes, args.seed,
                               args.per_shard, args.content, progress=not args.quiet)
    else:
        manifest = make_dataset(args.dir, args.samples, nbytes, args.classes, args.seed, progress=not args.quiet,
                                fmt=args.format, sizes=sizes)
    print(f"wrote {args.samples} samples and {manifest}")
    return 0


def _cmd_pack(args):
    from ..catalog import Catalog
    from ..job.packing import pack

    if "://" in args.source or "://" in args.output:
        raise StagerError("pack reads a local directory and writes one; give paths, not URLs")
    catalog = (Catalog.from_manifest(args.source, args.manifest) if args.manifest
               else Catalog.from_directory(args.source, args.extensions))
    manifest, shards = pack(catalog, args.output, args.format, args.per_shard, processes=args.processes,
                            progress=not args.quiet)
    print(f"packed {len(catalog)} samples into {shards} {args.format} containers under {args.output}; "
          f"{manifest} lists them (dataset.manifest)")
    return 0


def add_dataset_parsers(sub):
    """Adds ``stager make-dataset`` and ``stager pack`` to the command's subparsers."""
    p = sub.add_parser("make-dataset", help="write a synthetic ImageNet-like dataset",
                       description="Write labelled random uint8 images as .npy files (or 256x256 JPEGs) "
                                   "under DIR/<class>/ and a manifest DIR/manifest.tsv; or, with --config, "
                                   "the dataset a job config's synthetic section describes, at its "
                                   "dataset.source. The only command, with `stager demo`, that writes data.")
    p.add_argument("dir", nargs="?", help="directory to create the dataset in")
    p.add_argument("--config", metavar="FILE.yaml", help="write the config's synthetic dataset at its dataset.source")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--samples", type=int, help="number of samples")
    p.add_argument("--bytes", type=int, help="approximate bytes per sample (default 196736: 256x256x3 as "
                                             ".npy; 115000 as JPEG)")
    p.add_argument("--image-size", metavar="WxH[,WxH...]|mixed",
                   help="with --format jpeg: each image's width x height in turn (default 256x256); mixed: "
                        "ImageNet's commonest sizes (500x375, 500x333, 375x500, 500x500...). --bytes is then the "
                        "first size's")
    p.add_argument("--format", choices=("npy", "jpeg", "tar", "hdf5"), default="npy",
                   help="npy: random uint8 arrays (default); jpeg: 256x256 RGB JPEGs, decoded by the image loader; "
                        "tar: WebDataset shards of --content samples and their labels; hdf5: containers whose "
                        "datasets x and y hold one sample per row")
    p.add_argument("--content", choices=("npy", "jpeg"), default="npy", help="what a tar shard's samples hold")
    p.add_argument("--per-shard", type=int, default=1000, help="samples per container (tar, hdf5; default 1000)")
    p.add_argument("--classes", type=int, default=10, help="number of labels (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the content (default 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_make_dataset)

    p = sub.add_parser("pack", help="pack a folder of sample files into tar shards or HDF5 containers",
                       description="Pack the files under SRC (scanned, or listed by --manifest) into containers of "
                                   "--per-shard samples each under OUT, in listing order, and write "
                                   "OUT/manifest.tsv listing the containers. tar: WebDataset's layout, a file "
                                   "KEY.EXT becomes member KEY.EXT, its label KEY.cls. hdf5: .npy files of one "
                                   "shape become rows of dataset x, labels rows of y.")
    p.add_argument("source", metavar="SRC", help="directory of sample files")
    p.add_argument("output", metavar="OUT", help="directory to write the containers in (new or empty)")
    p.add_argument("--format", choices=("tar", "hdf5"), default="tar", help="container format (default tar)")
    p.add_argument("--per-shard", type=int, default=1000, help="samples per container (default 1000)")
    p.add_argument("--manifest", help="read this manifest (relative to SRC) instead of scanning; its labels go "
                                      "with the samples")
    p.add_argument("--extensions", nargs="*", default=[], help="when scanning, keep only these suffixes")
    p.add_argument("--processes", type=_positive, metavar="N",
                   help="processes writing containers at once, each a whole container (default: the cores this "
                        "process may use); the containers are the same whatever N")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_pack)
