"""Catalog entries of ``nndoctor data``: F101–F113 (image folders) and F201–F203 (TFRecord).

Each class is metadata plus documentation; detection lives in ``filechecks`` (per file),
``analyze`` (across files) and ``tfrecord_analyze``. ``nndoctor checks F101`` prints the docs.
"""

from __future__ import annotations

from nndoctor.core.findings import Severity
from nndoctor.core.registry import Check, register


class DataCheck(Check):
    scope = "data"


@register
class UnreadableFile(DataCheck):
    """
    ## What it does
    Finds files a loader will fail on: truncated or corrupt JPEG/PNG/WebP/…, zero-byte files,
    decompression bombs (more pixels than Pillow's limit of ~89 Mpx), files named like images
    that are something else (macOS `._name.jpg` AppleDouble files, HTML error pages saved as
    `.jpg`), unreadable folders, symlink loops, broken links, files deleted during the scan,
    and (as a warning) file names that are not valid UTF-8.

    Every image is decoded in full (JPEG in draft mode, which still entropy-decodes the
    whole stream) and its structure checked: the JPEG end-of-image marker and every PNG
    chunk CRC. Pillow's `Image.verify()` is not enough: it does nothing for JPEG, so a
    photo cut in half passes it.

    ## Why is this bad?
    A bad file stops an epoch hours in (`OSError: image file is truncated`), or — with
    `ImageFile.LOAD_TRUNCATED_IMAGES = True` or OpenCV, which returns `None` — silently
    becomes a grey or empty sample that the model learns from.

    ## Example
    ```
    data/train/cat/0042.jpg   # 18 kB of a 60 kB upload: no FFD9 end marker
    data/train/dog/._0007.jpg # AppleDouble metadata copied from a Mac
    ```

    ## Use instead
    Delete or re-download the files listed, and remove `._*` / `__MACOSX` debris
    (`find data -name '._*' -delete`). Do not paper over them with `LOAD_TRUNCATED_IMAGES`.

    ## References
    - Pillow docs, `Image.verify()`: "this method only works for PNG … for other formats it
      does nothing"; `Image.MAX_IMAGE_PIXELS` and `DecompressionBombError`.
    - JPEG (ITU T.81) ends every image with the EOI marker FFD9; PNG (RFC 2083) protects
      every chunk with a CRC-32.
    """

    code = "F101"
    name = "unreadable-file"
    severity = Severity.ERROR
    summary = "corrupt, truncated or undecodable files"
    fix = "Delete or replace the files listed (re-download or re-export them); never train with LOAD_TRUNCATED_IMAGES as a workaround."


@register
class MixedColorModes(DataCheck):
    """
    ## What it does
    Counts the Pillow modes of all images and lists the ones whose mode differs from the
    majority: grayscale (`L`), RGBA, palette (`P`), CMYK or 16-bit images among RGB ones.

    ## Why is this bad?
    Loaders that do not convert (OpenCV with `IMREAD_UNCHANGED`, `torchvision.io.read_image`,
    `tf.io.decode_image`) return 1, 3 or 4 channels depending on the file, and batching fails
    late: `Cannot batch tensors with different shapes in component 0. First element had shape
    [224,224,3] and element 3 had shape [224,224,1]`. With `.convert("RGB")` RGBA images lose
    their alpha (transparent background becomes black) and CMYK colours shift.

    ## Example
    9,812 RGB photos and 188 grayscale scans in the same class folders.

    ## Use instead
    Convert once, explicitly: `Image.open(p).convert("RGB")` in the dataset (torchvision's
    default loader does this) or `tf.image.decode_jpeg(x, channels=3)`; or re-save the odd
    files as RGB.

    ## References
    - Pillow "Modes" documentation; torchvision `datasets.folder.pil_loader`.
    """

    code = "F102"
    name = "mixed-color-modes"
    severity = Severity.WARNING
    summary = "grayscale/RGBA/CMYK/palette images among RGB ones"
    fix = 'Convert explicitly when loading (Image.open(p).convert("RGB"), or decode_jpeg(..., channels=3)), or re-save the files listed as RGB.'


@register
class ImageSmallerThanCrop(DataCheck):
    """
    ## What it does
    With `--crop N`, lists images whose shorter side is below N pixels. Without `--crop`,
    reports (as info) the spread of image sizes when images do not all have one size.

    ## Why is this bad?
    `transforms.RandomCrop(N)` raises `ValueError: Required crop size (N, N) is larger than
    input image size` — or, with `pad_if_needed=True`, trains on mostly padding. Images of
    different sizes without a Resize fail to batch: `stack expects each tensor to be equal
    size` / `Sizes of tensors must match except in dimension 0. Got 375 and 500`.

    ## Example
    `RandomCrop(224)` over a folder where 3% of images are 160×120 thumbnails.

    ## Use instead
    `transforms.Resize(N)` (shorter side to N) before `RandomCrop(N)`, or
    `RandomResizedCrop(N)`; or remove the thumbnails.

    ## References
    - torchvision `transforms.RandomCrop`, `Resize`, `RandomResizedCrop` documentation.
    """

    code = "F103"
    name = "image-smaller-than-crop"
    severity = Severity.WARNING
    summary = "images smaller than the training crop; size spread"
    fix = "Resize before cropping (transforms.Resize(N) then RandomCrop(N), or RandomResizedCrop(N)), or drop the small images."


@register
class FormatExtensionMismatch(DataCheck):
    """
    ## What it does
    Compares each file's content (its signature bytes) with its extension: a PNG named
    `.jpg`, a WebP named `.png`, or a real image with an extension ImageFolder does not
    accept (`.JPG~`, no extension, `.jfif`).

    ## Why is this bad?
    Pillow sniffs content and does not care, but `tf.io.decode_jpeg`, DALI, NVJPEG and many
    `glob("*.jpg")` pipelines do: they fail or skip the file. Images with an extension outside
    `IMG_EXTENSIONS` are silently skipped by torchvision's ImageFolder, so samples vanish.

    ## Example
    `cat/1234.jpg` whose first bytes are `89 50 4E 47` (PNG).

    ## Use instead
    Rename the files to match their content, or re-encode them to the intended format.

    ## References
    - torchvision `datasets.folder.IMG_EXTENSIONS`; file signatures of JPEG (FF D8 FF),
      PNG (89 50 4E 47 0D 0A 1A 0A), WebP (RIFF….WEBP).
    """

    code = "F104"
    name = "format-extension-mismatch"
    severity = Severity.WARNING
    summary = "content format differs from the extension (PNG named .jpg)"
    fix = "Rename the files to the extension of their content (or re-encode them)."


@register
class NonImageFile(DataCheck):
    """
    ## What it does
    Lists files inside class folders (or a flat image folder) that are not images and are not
    named like images: `.DS_Store`, `Thumbs.db`, `labels.txt`, archives, PDFs.

    ## Why is this bad?
    ImageFolder skips them, but `glob("**/*")`-style loaders and `tf.data.Dataset.list_files`
    do not; and they are a sign that the folder was assembled by hand and may hide worse
    (annotation files in the wrong place, an unpacked archive missing).

    ## Example
    `data/train/dog/.DS_Store`, `data/train/cat/readme.txt`.

    ## Use instead
    Keep only images in class folders; put metadata beside the dataset root.

    ## References
    - torchvision `ImageFolder(is_valid_file=…)`.
    """

    code = "F105"
    name = "non-image-file"
    severity = Severity.WARNING
    summary = "stray non-image files inside class folders"
    fix = "Move the files listed out of the class folders (or delete OS debris such as .DS_Store and Thumbs.db)."


@register
class PhantomClassDirectory(DataCheck):
    """
    ## What it does
    Finds hidden or system folders at the class level of an ImageFolder tree:
    `.ipynb_checkpoints`, `__MACOSX`, `.git`, `@eaDir`, `__pycache__`, `$RECYCLE.BIN`.

    ## Why is this bad?
    `ImageFolder.find_classes` takes every sub-folder as a class, sorted by name. A folder
    starting with `.` sorts first, so `.ipynb_checkpoints` becomes class 0 and every real
    class index shifts by one between the machine that has it (e.g. the Jupyter server) and
    the one that does not: the model trains, but on wrong labels, or the output layer has one
    class too many. An empty phantom folder makes ImageFolder raise.

    ## Example
    `data/train/.ipynb_checkpoints/` created by opening an image in JupyterLab.

    ## Use instead
    Delete the folder (`rm -r data/train/.ipynb_checkpoints`), or subclass ImageFolder and
    filter `find_classes` to names that do not start with `.`.

    ## References
    - pytorch/vision#2831 ("ImageFolder should ignore hidden directories").
    """

    code = "F106"
    name = "phantom-class-directory"
    severity = Severity.ERROR
    summary = "hidden/system folders (.ipynb_checkpoints, __MACOSX) that ImageFolder would take as classes"
    fix = "Delete the folders listed (or filter hidden folders out in find_classes) so class indices match the real classes."


@register
class SplitClassMismatch(DataCheck):
    """
    ## What it does
    Compares the class folder names of the splits (train/val/test, or the folders given).

    ## Why is this bad?
    ImageFolder numbers classes by their sorted position *within each split*. If val lacks
    one class, or has an extra one, every class after it gets another index than in train:
    validation accuracy is near chance although the model is fine, or — worse — it looks
    plausible and is wrong.

    ## Example
    `train/{cat,cow,dog}` and `val/{cat,dog}`: `dog` is 2 in train and 1 in val.

    ## Use instead
    Make the class folders identical in every split (an empty folder is not enough — it
    raises), or build `class_to_idx` once from train and pass it to every split.

    ## References
    - torchvision `DatasetFolder.find_classes` / `make_dataset(class_to_idx=…)`.
    """

    code = "F107"
    name = "split-class-mismatch"
    severity = Severity.ERROR
    summary = "train and val class lists differ, so class indices shift"
    fix = "Give every split the same class folders, or build class_to_idx from the training split and reuse it for the others."


@register
class ClassImbalance(DataCheck):
    """
    ## What it does
    Counts decodable images per class in each split and reports empty classes and classes
    with fewer than 1/10 of the largest class's images (imbalance ratio above 10:1).

    ## Why is this bad?
    An empty class folder makes ImageFolder raise (recent torchvision) or leaves an output
    unit that never sees a positive. Past about 10:1 a plain cross-entropy model mostly
    ignores the small classes and accuracy hides it.

    ## Example
    `train/cat`: 4,000 images, `train/lynx`: 37 images.

    ## Use instead
    Collect more data for the small classes, or compensate: `WeightedRandomSampler`,
    `CrossEntropyLoss(weight=…)`, focal loss; report per-class metrics.

    ## References
    - Buda, Maki, Mazurowski (2018), "A systematic study of the class imbalance problem in
      convolutional neural networks" — effects grow with the imbalance ratio; 10:1 is where
      they become marked in their experiments.
    """

    code = "F108"
    name = "class-imbalance"
    severity = Severity.WARNING
    summary = "empty or heavily under-represented classes"
    fix = "Collect more data for the classes listed, or rebalance (WeightedRandomSampler, class weights in the loss) and track per-class metrics."
    heuristic = True


@register
class ExactDuplicates(DataCheck):
    """
    ## What it does
    Groups files of one split by a content hash (BLAKE2b-128 of the bytes) and lists every
    group of identical files; groups that span two classes are called out.

    ## Why is this bad?
    Duplicates over-weight some samples and inflate the apparent dataset size; the same image
    under two class folders is a contradictory label that caps accuracy.

    ## Example
    `train/cat/img_001.jpg` and `train/cat/img_001 (1).jpg`; `train/.../x-checkpoint.jpg`.

    ## Use instead
    Keep one copy of each group; resolve cross-class copies by relabelling.

    ## References
    - Barz & Denzler (2020), "Do we train on test data? Purging CIFAR of near-duplicates".
    """

    code = "F109"
    name = "exact-duplicates"
    severity = Severity.WARNING
    summary = "identical files within a split"
    fix = "Keep one file of each duplicate group (and fix the label where copies sit in different classes)."


@register
class CrossSplitDuplicates(DataCheck):
    """
    ## What it does
    Finds images that appear in two splits: byte-identical files (content hash) and near
    duplicates — the same picture resized, re-encoded or slightly recoloured — by a 64-bit
    perceptual hash (DCT of a 32×32 grayscale reduction, 8×8 low frequencies vs their median).
    A pair is reported when the Hamming distance is at most 6 of 64 bits (`--near-distance`).

    ## Why is this bad?
    Evaluation images that the model trained on measure memory, not generalisation: the
    validation score is inflated and model selection is biased.

    ## Example
    `val/dog/123.jpg` is `train/dog/88.png` saved at 80% size as JPEG.

    ## Use instead
    Remove the listed evaluation files (or move them to train), and split by source
    (photographer, patient, video) rather than by file.

    ## References
    - Barz & Denzler (2020), CIFAR's test set shares ~10% near duplicates with its train set.
    - Threshold: re-encoding and resizing move 0–4 bits of this hash; unrelated photos differ
      in about 32 bits (binomial, sd 4), so ≤6 keeps false matches near 1e-7 per pair while
      catching resized and re-compressed copies. Blank images (no structure) are not hashed.
    """

    code = "F110"
    name = "cross-split-duplicates"
    severity = Severity.ERROR
    summary = "exact or near duplicates between train and val/test (leakage)"
    fix = "Remove the listed files from the evaluation split (or from train), and split by source rather than by file."
    heuristic = True


@register
class ExifRotation(DataCheck):
    """
    ## What it does
    Lists JPEG/TIFF/WebP images whose EXIF Orientation tag is not 1 (upright).

    ## Why is this bad?
    Photo viewers rotate these images, so they look right to you, but `PIL.Image.open`,
    torchvision's loaders (`decode_jpeg` unless `apply_exif_orientation=True`) and OpenCV
    with `IMREAD_IGNORE_ORIENTATION` give the stored pixels: the network sees the picture
    sideways or upside down, and bounding boxes no longer match.

    ## Example
    Phone photos with Orientation = 6 (stored sideways).

    ## Use instead
    Apply the tag when loading (`ImageOps.exif_transpose(img)`), or rewrite the files upright
    once (`exiftran -ai`, `mogrify -auto-orient`).

    ## References
    - EXIF 2.3 tag 0x0112 Orientation; Pillow `ImageOps.exif_transpose`.
    """

    code = "F111"
    name = "exif-rotation"
    severity = Severity.WARNING
    summary = "EXIF orientation tags the loader will ignore"
    fix = "Apply ImageOps.exif_transpose() in the loader, or rewrite the files upright once (mogrify -auto-orient)."


@register
class DegenerateImage(DataCheck):
    """
    ## What it does
    Lists images that carry almost nothing to learn from: tiny (shorter side under 10 px, or
    under a quarter of the dataset's median shorter side once it has 8 images or more — a
    12×12 icon among 128-px photos), extreme aspect ratio (over 10:1), or blank — a single
    flat colour (grayscale standard deviation under 1 on the 0–255 scale, measured on a
    reduction of the image).

    ## Why is this bad?
    These are usually failed exports, placeholder images, tracking pixels or black video
    frames. Blank images are exactly what a failed read becomes (OpenCV's `None` turned into
    zeros), and resizing a 400×20 strip to 224×224 gives noise. An image four times smaller
    than its neighbours is blown up by the same `Resize` into a blur of a few pixels.

    ## Example
    `train/cat/000873.jpg`: 640×480, all black.

    ## Use instead
    Delete or replace the images listed.

    ## References
    - Thresholds: 10 px is below any usable recognition resolution (MNIST is 28, CIFAR 32);
      a quarter of the median means 4× more upsampling (16× fewer pixels) than the rest of
      the data gets, and recognition degrades quickly below 32×32 (Torralba, Fergus, Freeman,
      "80 million tiny images", IEEE TPAMI 2008);
      10:1 is beyond photo (3:2, 16:9) and panorama crops used in practice; std < 1 of 255
      means less than one grey level of variation — a flat colour after JPEG noise.
    """

    code = "F112"
    name = "degenerate-image"
    severity = Severity.WARNING
    summary = "tiny, extreme aspect ratio, or blank/constant images"
    fix = "Delete or replace the images listed."
    heuristic = True


@register
class DatasetStatistics(DataCheck):
    """
    ## What it does
    Computes the per-channel mean and standard deviation of the images (of the training split
    when splits are found), with each image weighted equally, and prints them ready to paste
    into `transforms.Normalize` (0–1 scale) and as 0–255 values (mmcv/Caffe style). When every
    image of those splits is grayscale (MNIST-style PNGs, N×H×W arrays), one mean and one std are
    given: `ToTensor` makes one channel of them, and a three-value `Normalize` fails on it.

    ## Why is this bad?
    It is not; it is advice. Training from scratch with ImageNet's statistics on data that is
    much darker or lighter, or using 0–1 statistics on 0–255 pixels, slows or breaks training.

    ## Example
    `transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])` on X-rays.

    ## Use instead
    When fine-tuning a pretrained model keep the statistics it was trained with; when
    training from scratch use these.

    ## References
    - Statistics are measured on images reduced to about 128 px (JPEG draft decoding), which
      changes the mean by well under 0.01 and slightly lowers the std (fine detail is smoothed).
    """

    code = "F113"
    name = "dataset-statistics"
    severity = Severity.INFO
    summary = "per-channel mean/std to normalize with — info"
    fix = "Use transforms.Normalize(mean, std) with the values shown when training from scratch."


@register
class TFRecordCorrupt(DataCheck):
    """
    ## What it does
    Reads every record of every TFRecord file (plain, GZIP or ZLIB) and verifies the framing:
    the masked CRC32C of the 8-byte length and of the data, and that no record is cut short.

    ## Why is this bad?
    TensorFlow raises `DataLossError: corrupted record at N` when it meets the record,
    possibly hours into training; readers that skip CRCs (the `tfrecord` PyPI package) feed
    the corrupt bytes on silently.

    ## Example
    A shard copied while it was still being written: its last record is truncated.

    ## Use instead
    Re-generate or re-copy the shard (compare checksums with the source).

    ## References
    - TensorFlow `tensorflow/core/lib/io/record_writer.cc`: length, masked crc32c(length),
      data, masked crc32c(data); mask = rotate-right-15(crc) + 0xa282ead8.
    """

    code = "F201"
    name = "tfrecord-corrupt"
    severity = Severity.ERROR
    summary = "TFRecord length/data CRC mismatch or truncation"
    fix = "Re-generate or re-copy the shards listed; verify them against the source's checksums."


@register
class TFRecordSchemaInconsistent(DataCheck):
    """
    ## What it does
    Parses every record as a `tf.train.Example` and compares them: records that do not parse,
    features missing from some records (present in at least half), a feature whose type
    (bytes/float/int64) varies, and a feature whose number of values differs from the length
    that at least 90% of the records have.

    ## Why is this bad?
    `tf.io.parse_single_example` with `FixedLenFeature` fails on exactly those records —
    `InvalidArgumentError: Key: x. Can't parse serialized Example.` — often only when the
    shuffle buffer reaches them.

    ## Example
    `label` written as int64 in most shards and as float in one; `bbox` of 4 values except in
    3 records with 8.

    ## Use instead
    Fix the writer and regenerate the records listed; or declare the feature
    `VarLenFeature` / `RaggedFeature` if its length legitimately varies.

    ## References
    - TensorFlow "TFRecord and tf.train.Example" guide; `tf.io.FixedLenFeature`.
    - 90%: below that the length varies by design (a variable-length feature), above it the
      rare exceptions are writer bugs.
    """

    code = "F202"
    name = "tfrecord-schema-inconsistent"
    severity = Severity.ERROR
    summary = "feature keys, types or lengths vary across records"
    fix = "Regenerate the records listed with the common schema, or parse the feature as VarLenFeature/RaggedFeature."
    heuristic = True


@register
class TFRecordUndecodableImage(DataCheck):
    """
    ## What it does
    Decodes every encoded image found in the records (bytes features that start with an image
    signature, or whose key says `encoded`/`jpeg`/`png`) and lists those that fail.

    ## Why is this bad?
    `tf.io.decode_jpeg` raises mid-epoch (`Invalid JPEG data or crop window`), or a
    `decode_image` in a `.ignore_errors()` pipeline silently drops samples.

    ## Example
    An `image/encoded` feature holding a truncated JPEG or raw pixels.

    ## Use instead
    Re-encode the source images and regenerate the records listed.

    ## References
    - TensorFlow `tf.io.decode_image`; Pillow decoding with the same checks as F101.
    """

    code = "F203"
    name = "tfrecord-undecodable-image"
    severity = Severity.ERROR
    summary = "encoded image bytes in a record do not decode"
    fix = "Re-encode the source images and regenerate the records listed."

