"""The one data format of an experiment: Megatron's indexed dataset (`<prefix>.bin` + `<prefix>.idx`), read in
megatron-core `GPTDataset`'s sample order.

Real Megatron-LM reads only this format, MindFormers ports the same reader, and both twin sides read it here with
nothing but numpy (a MindSpore host has no torch, which megatron-core's own reader imports):

- `indexed`: the `.bin`/`.idx` files, byte for byte as `megatron.core.datasets.indexed_dataset` writes and reads
  them (`IndexedDatasetBuilder`, `_IndexWriter`, `_IndexReader`);
- `gpt`: `GPTDataset`'s document, sample and shuffle indices (`gpt_dataset.py`, `helpers.cpp::build_sample_idx`),
  epochs and the separate final epoch included, and the samples they select.

`tests/datasets/` builds both with megatron-core itself and compares them element for element.
"""
