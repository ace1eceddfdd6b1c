"""What is tuned for: GPU architectures and products (``archs``), model shapes and synthetic GGUFs
(``models``), and the roofline that bounds what a GPU can do on a model (``roofline``)."""
