"""The decoded tier (``staging.decoded``): samples built from kept decoded copies equal those decoded again.

Every run is compared with the same run under ``staging.decoded: off`` and,
where the transforms are fixed, with PyTorch's own DataLoader, tensor for
tensor over several epochs; the tier's parts are checked on real files,
including a corrupted copy and a disk that fills.
"""

import os

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from iterators.pytorch import StagedLoader  # first: it makes torchvision importable beside a CPU-only torch
from stager.decoded import (CorruptRecord, DecodedTier, create, create_shared, decoded_budget, pack, shared_note,
                            tier_choice, unpack)
from stager.decoded.tier import DIR

from conftest import size_limited_tmpfs

torchvision = pytest.importorskip("torchvision")
from torchvision import transforms as T  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

FIXED = T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor()])
RANDOM = T.Compose([T.RandomResizedCrop(16, scale=(0.3, 1.0)), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4),
                    T.ToTensor()])
EPOCHS = 3
KIND = "the tests' records"


def _record(obj):
    return bytearray(b"".join(bytes(part) for part in pack(obj)))


def write_images(root, seed=0):
    """An ImageFolder of every kind the default loader meets: RGB, L, CMYK and palette JPEGs and PNGs."""
    rng = np.random.default_rng(seed)
    kinds = [("RGB", "jpg"), ("L", "jpg"), ("CMYK", "jpg"), ("RGB", "png"), ("P", "png"), ("RGBA", "png")]
    for c in range(2):
        os.makedirs(os.path.join(root, f"class{c}"), exist_ok=True)
        for i in range(12):
            mode, ext = kinds[(i + c) % len(kinds)]
            h, w = int(rng.integers(20, 36)), int(rng.integers(20, 36))
            img = Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8))
            img = img.quantize(16) if mode == "P" else img.convert(mode)
            img.save(os.path.join(root, f"class{c}", f"{i:03d}.{ext}"))
    return root


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_images(str(tmp_path_factory.mktemp("decoded") / "train"))


def config(tmp_path, decoded, **staging):
    return {"staging": {"local_dir": str(tmp_path / "local"), "prefetchers": 2, "decoded": decoded, **staging},
            "processes": {"shutdown_timeout_s": 10.0}}


def epochs(loader, count=EPOCHS):
    out = [[[t.clone() for t in batch] for batch in loader] for _ in range(count)]
    return out, loader.report()


def run(dataset, tmp_path, decoded, shuffle=True, workers=2, **staging):
    tmp_path.mkdir(exist_ok=True)
    with StagedLoader(dataset, batch_size=5, shuffle=shuffle, num_workers=workers,
                      generator=torch.Generator().manual_seed(11), config=config(tmp_path, decoded, **staging)) as dl:
        return epochs(dl)


def assert_kept_and_built(decoded, n, epochs=EPOCHS):
    """Every sample kept, and every later read built from a copy but for those that met a copy being written.

    Readers decode ahead: at an epoch's turn, a reader may take a sample for the next epoch while another
    still decodes it for this one; both decode it, and each keeps a copy. So each read of a later epoch is
    built from a copy or made one copy more.
    """
    extra = decoded["samples_kept"] - n
    assert extra >= 0 and decoded["samples_from_decoded"] + extra >= (epochs - 1) * n, decoded


def assert_same(got, want):
    assert len(got) == len(want)
    for g_epoch, w_epoch in zip(got, want):
        assert len(g_epoch) == len(w_epoch)
        for g, w in zip(g_epoch, w_epoch):
            assert all(torch.equal(a, b) for a, b in zip(g, w))


@pytest.mark.parametrize("mode", ["RGB", "L", "I;16", "F", "RGBA", "CMYK"])
def test_an_image_rebuilt_from_its_record_has_the_same_mode_size_and_pixels(mode):
    img = Image.fromarray((np.random.default_rng(2).random((7, 9)) * 200).astype(np.uint8)).convert(mode)
    back = unpack(_record(img))
    assert (back.mode, back.size, back.tobytes()) == (img.mode, img.size, img.tobytes())
    back.putpixel((0, 0), 1 if mode in ("L", "I;16", "F") else (1,) * len(mode))  # writable, as a loader's image


def test_an_array_rebuilt_from_its_record_is_equal_and_writable_and_a_palette_image_is_not_kept():
    arr = np.random.default_rng(3).random((3, 5, 4)).astype(np.float32).transpose(1, 0, 2)  # not contiguous
    back = unpack(_record(arr))
    assert back.dtype == arr.dtype and back.shape == arr.shape and np.array_equal(back, arr)
    back[0, 0, 0] = 7.0
    assert pack(Image.new("P", (4, 4))) is None and pack(np.array([object()])) is None and pack("text") is None


@pytest.mark.parametrize("damage", ["flip", "cut", "magic"])
def test_a_damaged_record_is_refused_with_the_reason(damage):
    buf = _record(np.arange(100, dtype=np.int64))
    if damage == "flip":
        buf[-3] ^= 0x10
    elif damage == "cut":
        del buf[-9:]
    else:
        buf[0:4] = b"XXXX"
    why = {"flip": "hash does not match", "cut": "were written", "magic": "header"}[damage]
    with pytest.raises(CorruptRecord, match=why):
        unpack(buf)


def _loader_calls():
    calls = []

    def load(path):
        calls.append(path)
        return np.load(path)
    return calls, load


def _npy_files(tmp_path, count):
    paths = []
    for i in range(count):
        path = str(tmp_path / f"{i}.npy")
        np.save(path, np.full((64, 64), i, dtype=np.float32))
        paths.append(path)
    return paths


def test_readers_of_one_node_share_what_each_kept_and_a_corrupt_copy_is_warned_about_and_decoded_again(tmp_path):
    paths = _npy_files(tmp_path, 6)
    job = tmp_path / "job"
    job.mkdir()
    create(str(job), len(paths), 64 << 20, "on", KIND)
    calls, load = _loader_calls()
    first, second = DecodedTier.open(str(job), KIND), DecodedTier.open(str(job), KIND)  # two readers
    for i, path in enumerate(paths):
        assert np.array_equal(first.load(i, path, load), np.load(path))
    assert len(calls) == 6 and first.kept == 6
    for i, path in enumerate(paths):
        assert np.array_equal(second.load(i, path, load), np.load(path))
    assert len(calls) == 6 and second.hits == 6  # nothing decoded again
    segment = job / DIR / "seg-0"
    data = bytearray(segment.read_bytes())
    data[1000] ^= 0xFF  # inside the first record's pixels
    segment.write_bytes(data)
    with pytest.warns(RuntimeWarning,
                      match=r"decoded copy of .*0\.npy \(sample 0, in .*seg-0 at byte 0\).*hash does not match"):
        again = [second.load(i, path, load) for i, path in enumerate(paths)]
    assert all(np.array_equal(a, np.load(p)) for a, p in zip(again, paths)) and len(calls) == 7
    first.close()
    second.close()
    second.close()


def test_a_disk_that_fills_while_copies_are_written_leaves_the_samples_read_encoded(tmp_path):
    paths = _npy_files(tmp_path, 12)  # 16 KiB of pixels each
    with size_limited_tmpfs(tmp_path / "nvme", "96k") as mnt:
        create(str(mnt), len(paths), 64 << 20, "on", KIND)  # a budget the disk cannot hold
        calls, load = _loader_calls()
        tier = DecodedTier.open(str(mnt), KIND)
        got = [tier.load(i, path, load) for i, path in enumerate(paths)]
        assert all(np.array_equal(a, np.load(p)) for a, p in zip(got, paths))
        assert 0 < tier.kept < len(paths) and not tier.writing and "filled" in tier.note
        again = [tier.load(i, path, load) for i, path in enumerate(paths)]
        assert all(np.array_equal(a, np.load(p)) for a, p in zip(again, paths))
        assert tier.hits == tier.kept and len(calls) == 2 * len(paths) - tier.kept
        tier.close()


def test_a_groups_tier_is_made_once_for_the_first_jobs_kind_and_refused_to_other_kinds(tmp_path):
    group = str(tmp_path)
    first = create_shared(group, 10, 4 << 20, "on", "pil", "4.0 MiB: staging.capacity 8.0 MiB, less...")
    again = create_shared(group, 10, 8 << 20, "on", "hwc", "8.0 MiB: ...")  # a later job: the group's stays
    assert again == first and first["kind"] == "pil" and os.listdir(group) == [DIR]
    assert DecodedTier.open(group, "hwc") is None
    tier = DecodedTier.open(group, "pil")
    assert tier is not None and tier.segments == first["segments"] > 0
    tier.close()
    assert shared_note(again, "pil", "x") == ("4.0 MiB: staging.capacity 8.0 MiB, less...; the group's, shared by "
                                              "its jobs")
    assert shared_note(again, "hwc", "x").startswith("none: the group's decoded copies are another loader's (pil)")
    assert shared_note(create_shared(str(tmp_path / "none"), 10, 0, "on", "pil", "none: no room"), "pil",
                       "none: no room") == "none: no room"  # no room, and none made: the job's own reason


def test_the_budget_leaves_the_encoded_copies_their_room(tmp_path):
    assert decoded_budget("off", None, str(tmp_path), 100)[0] == 0
    mib = 1 << 20
    assert decoded_budget("auto", 5 * mib, str(tmp_path), mib) == (4 * mib, decoded_budget("on", 5 * mib,
                                                                                          str(tmp_path), mib)[1])
    room, why = decoded_budget("auto", 5 * mib, str(tmp_path), 5 * mib - 1000)
    assert room == 0 and why.startswith("none") and "read encoded" in why
    free = os.statvfs(tmp_path)
    assert 0 < decoded_budget("auto", None, str(tmp_path), 1)[0] < free.f_bavail * free.f_frsize


def test_image_folder_samples_equal_decoding_them_again_and_dataloaders_every_epoch(images, tmp_path):
    dataset = ImageFolder(images, transform=RANDOM)
    on, report = run(dataset, tmp_path / "on", "on")
    off, report_off = run(dataset, tmp_path / "off", "off")
    assert_same(on, off)
    n = len(dataset)
    kept = report["decoded"]
    assert_kept_and_built(kept, n)
    assert report_off["decoded"]["samples_kept"] == 0 and report_off["decoded"]["note"] == "staging.decoded is off"
    fixed = ImageFolder(images, transform=FIXED)
    want = [[[t.clone() for t in b] for b in DataLoader(fixed, batch_size=5)] for _ in range(EPOCHS)]
    got, report = run(fixed, tmp_path / "fixed", "on", shuffle=False, workers=3)
    assert_same(got, want)
    assert_kept_and_built(report["decoded"], n)


def own_loader(path):
    with open(path, "rb") as fh:
        return Image.open(fh).convert("L")


def test_a_loader_of_the_users_own_keeps_no_decoded_copies_unless_declared_pure(images, tmp_path):
    dataset = ImageFolder(images, transform=FIXED, loader=own_loader)
    got, report = run(dataset, tmp_path / "own", "on")
    assert report["decoded"]["samples_kept"] == report["decoded"]["samples_from_decoded"] == 0
    assert not os.listdir(os.path.join(tmp_path, "own", "local"))  # and the job's directory went with the run
    from stager.telemetry.summary import decoded_lines
    assert decoded_lines(report) == ["decoded copies: none kept: the samples' loader is not one known to be pure "
                                     "(docs/decoded.md)"]
    (tmp_path / "pure").mkdir()
    with StagedLoader(dataset, batch_size=5, shuffle=True, num_workers=2, pure_loader=True,
                      generator=torch.Generator().manual_seed(11), config=config(tmp_path / "pure", "on")) as dl:
        declared, report = epochs(dl)
    assert_same(declared, got)
    assert_kept_and_built(report["decoded"], len(dataset))


def test_stagers_image_loader_keeps_its_pixels_and_gives_the_same_arrays(images, tmp_path):
    from stager.formats import decoded_kind, make_decoder
    from stager.formats.images import load_image

    path = os.path.join(images, "class0", "000.jpg")
    job = tmp_path / "job"
    job.mkdir()
    decoder = make_decoder("image", {"layout": "chw"})
    create(str(job), 1, 64 << 20, "on", decoded_kind(decoder))
    tier = DecodedTier.open(str(job), decoded_kind(decoder))
    assert decoder.use_decoded(tier)
    first, second = decoder.decode(path, 0, 0), decoder.decode(path, 0, 1)
    want = load_image(path, {"layout": "chw"})
    assert first.dtype == second.dtype == np.float32 and np.array_equal(first, want) and np.array_equal(second, want)
    assert tier.kept == tier.hits == 1
    tier.close()


def _chainer_examples(dataset, tmp_path, decoded, epochs=EPOCHS):
    from iterators.chainer import StagingIterator

    tmp_path.mkdir(exist_ok=True)
    conf = {**config(tmp_path, decoded), "reader": {"workers": 2}}
    with StagingIterator(dataset, 5, repeat=True, shuffle=False, config=conf) as it:
        got = [[example for _ in range(len(dataset) // 5) for example in it.next()] for _ in range(epochs)]
        return got, it.report()


@pytest.mark.parametrize("labeled", [True, False])
def test_chainers_image_datasets_give_their_own_examples_from_decoded_copies(images, tmp_path, labeled):
    chainer = pytest.importorskip("iterators.chainer", reason="Chainer is not installed (extra 'chainer')")._chainer
    files = sorted(os.path.relpath(os.path.join(d, f), images) for d, _, fs in os.walk(images) for f in fs)
    files = [f for f in files if f.endswith(".png") or f.endswith(".jpg")][:20]
    if labeled:
        dataset = chainer.datasets.LabeledImageDataset([(f, i % 3) for i, f in enumerate(files)], root=images)
    else:
        dataset = chainer.datasets.ImageDataset(files, root=images, dtype=np.uint8)
    got, report = _chainer_examples(dataset, tmp_path / "on", "on")
    want = [dataset[i] for i in range(len(dataset))]
    for epoch in got:
        for mine, theirs in zip(epoch, want):
            for a, b in zip(mine if labeled else (mine,), theirs if labeled else (theirs,)):
                assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert_kept_and_built(report["decoded"], len(dataset))


def test_a_capacity_that_holds_the_encoded_copies_alone_keeps_no_decoded_ones(images, tmp_path):
    dataset = ImageFolder(images, transform=RANDOM)
    dataset_bytes = sum(os.path.getsize(path) for path, _ in dataset.samples)
    tight, report = run(dataset, tmp_path / "tight", "on", capacity=str(dataset_bytes + 100_000))
    off, _ = run(dataset, tmp_path / "off", "off")
    assert_same(tight, off)
    assert report["decoded"]["samples_kept"] == report["decoded"]["samples_from_decoded"] == 0
    assert report["decoded"]["note"].startswith("none: staging.capacity")


@pytest.fixture(scope="module")
def jpeg_shards(tmp_path_factory):
    from stager.job.packing import make_shards

    out = str(tmp_path_factory.mktemp("shards") / "tar")
    make_shards(out, "tar", 30, 4000, 3, 5, 8, content="jpeg", progress=False)
    return out


def test_jpegs_in_tar_shards_are_kept_decoded_and_equal_reading_them_in_place(jpeg_shards, tmp_path):
    from iterators.pytorch import ShardDataset

    def tensors(sample):
        return torch.from_numpy(sample["jpg"].copy()), int(sample["cls"])

    dataset = ShardDataset(jpeg_shards, manifest="manifest.tsv", loader="image", transform=tensors)
    want = [[[t.clone() for t in b] for b in DataLoader(dataset, batch_size=5)]] * EPOCHS
    got, report = run(dataset, tmp_path / "on", "on", shuffle=False)
    assert_same(got, want)
    assert_kept_and_built(report["decoded"], len(dataset))
    raw = ShardDataset(jpeg_shards, manifest="manifest.tsv", loader="raw",
                       transform=lambda s: (torch.tensor(len(s["jpg"])), int(s["cls"])))
    _, report = run(raw, tmp_path / "raw", "on", shuffle=False)
    assert report["decoded"]["samples_kept"] == 0  # its parts are bytes: nothing decoded to keep


def test_a_jobs_image_shards_are_kept_decoded_in_the_chw_layout_it_asks_for(jpeg_shards, tmp_path):
    from stager.config import config_from_dict
    from stager.engine import Pipeline
    from stager.formats.shards import ShardReader, decode_parts

    cfg = config_from_dict({
        "dataset": {"source": jpeg_shards, "format": "tar", "manifest": "manifest.tsv", "loader": "image",
                    "layout": "chw"},
        "plan": {"batch_size": 5, "epochs": EPOCHS, "seed": 2},
        "staging": {"local_dir": str(tmp_path), "prefetchers": 2, "decoded": "on"},
        "reader": {"workers": 2},
    })
    with Pipeline(cfg) as pipe:
        got = [(int(i), sample) for b in pipe for i, sample in zip(b.indices, b.samples)]
        catalog, decoded = pipe.catalog, dict(pipe.stats.decoded)
    reader = ShardReader(catalog.layout)
    for i, parts in got:
        path = os.path.join(catalog.root, catalog.path(i))
        want = decode_parts(reader.read(path, i), "image", {"layout": "chw"})
        assert parts.keys() == want.keys() and parts["jpg"].dtype == np.float32
        assert all(np.array_equal(parts[k], want[k]) if isinstance(want[k], np.ndarray) else parts[k] == want[k]
                   for k in want)
    assert len(got) == EPOCHS * len(catalog)
    assert_kept_and_built(decoded, len(catalog))


def test_the_tier_choice_asks_the_local_disk_only_for_a_tier_that_may_be_made(tmp_path):
    gone = str(tmp_path / "never-made")  # the disk's answer would be an error: none is asked for below
    assert tier_choice("auto", False, False, None, gone, 100) == (
        0, "none: the samples' loader is not one known to be pure (docs/decoded.md)")
    assert tier_choice("on", True, True, None, gone, 100) == (0, "none: the plan reads each sample once")
    assert tier_choice("off", False, True, None, gone, 100) == (0, "staging.decoded is off")
    with pytest.raises(OSError):
        tier_choice("auto", True, False, None, gone, 100)
