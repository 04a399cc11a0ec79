"""``stager pack``: a folder of sample files into tar shards or HDF5 containers."""

from ..errors import StagerError


def _cmd_pack(args):
    from ..catalog import Catalog
    from ..job.packing import pack

    if "://" in args.source or "://" in args.output:
        raise StagerError("pack reads a local directory and writes one; give paths, not URLs")
    catalog = (Catalog.from_manifest(args.source, args.manifest) if args.manifest
               else Catalog.from_directory(args.source, args.extensions))
    manifest, shards = pack(catalog, args.output, args.format, args.per_shard, progress=not args.quiet)
    print(f"packed {len(catalog)} samples into {shards} {args.format} containers under {args.output}; "
          f"{manifest} lists them (dataset.manifest)")
    return 0


def add_pack_parser(sub):
    """Adds ``stager pack`` to the command's subparsers."""
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
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_pack)
