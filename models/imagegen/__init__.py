"""Training code for muestra's default image model (models/muestra-image): see models/train_image_model.py."""
