from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("assets", "0003_dataset_check_status"),
    ]

    operations = [
        migrations.AddField(
            model_name="registeredmodel",
            name="error",
            field=models.TextField(
                blank=True, help_text="Why the weight scan refused the checkpoint."
            ),
        ),
        migrations.AddField(
            model_name="registeredmodel",
            name="status",
            field=models.CharField(
                choices=[("checking", "Checking"), ("ready", "Ready"), ("failed", "Failed")],
                default="ready",
                max_length=16,
            ),
        ),
    ]
