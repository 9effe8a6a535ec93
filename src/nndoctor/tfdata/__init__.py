"""``tf.data`` input pipelines: how long the training waits for them, and how they shuffle.

``instrument`` patches TensorFlow only when the user's script imports it (dataset
construction lines, iterator fetch times, the first batches' labels); ``pipeline`` reads a
dataset's stages; ``timing`` and ``labels`` turn measurements into plain numbers;
``checks`` holds K106/K107 (importing it never imports TensorFlow).
"""
